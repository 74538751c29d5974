package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestBuildsOnceAndSweepsDeadProcesses(t *testing.T) {
	// A leftover of a test process that is gone (PID 2^22+1 does not exist). The first
	// build sweeps; sweep is called here too, as with -count=N only the first run builds.
	stale := filepath.Join(os.TempDir(), "agent-testbin-4194305")
	os.MkdirAll(stale, 0o755)
	a, b := FakeSGLang(t), FakeSGLang(t)
	if a != b {
		t.Errorf("built twice: %s, %s", a, b)
	}
	sweep()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead process's directory was kept: %v", err)
	}
	if _, err := os.Stat(a); err != nil {
		t.Errorf("sweep removed this process's own binaries: %v", err)
	}
	out, _ := exec.Command(a, "--model-path", "m", "--bogus-flag").CombinedOutput()
	if !strings.Contains(string(out), "unrecognized arguments: --bogus-flag") {
		t.Errorf("the fake did not answer as SGLang: %s", out)
	}
	if FreePort(t) <= 0 {
		t.Error("no port")
	}
}

func TestServersFindsOnlyThisTestsMarkedProcesses(t *testing.T) {
	home := t.TempDir()
	start := func(env ...string) *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		cmd.Env = env
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	ours := start("HOME="+home, "AGENT_SERVER=server.qwen#3")
	under := start("HOME="+home+"/state/home", "AGENT_SERVER=server.qwen#4") // the default HOME
	start("HOME=" + home)                                                    // no marker: not a server
	start("HOME="+home+"x", "AGENT_SERVER=server.qwen#3")                    // another test's
	start("XHOME="+home, "AGENT_SERVER=server.qwen#3")                       // HOME must match whole
	want := map[int]string{ours.Process.Pid: "AGENT_SERVER=server.qwen#3", under.Process.Pid: "AGENT_SERVER=server.qwen#4"}
	if got := Servers(home); len(got) != 2 || got[ours.Process.Pid] != want[ours.Process.Pid] || got[under.Process.Pid] != want[under.Process.Pid] {
		t.Fatalf("Servers = %v, want %v", got, want)
	}
	KillServers(home)
	done := make(chan error, 1)
	go func() { done <- ours.Wait() }()
	select {
	case <-done:
		if ws := ours.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
			t.Errorf("server ended with %v, want SIGKILL", ws)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("KillServers left the server running")
	}
}
