package server

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/internal/trust"
	"github.com/agent-dev/agent/resources/restest"
)

// Issue 13: the agent runs as root and trusts nothing another user could have written.
// What another local user could do is done as nobody (setpriv), against the real agent.

// runAgent runs the built agent with HOME=home and returns its exit code and output.
func runAgent(t *testing.T, home string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(testbin.Agent(t), args...)
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// writeSrvPlan writes srvPlan's server with its variables' values filled in, as an
// operator's plan file in dir.
func writeSrvPlan(t *testing.T, dir, logs string, port int, faults string, extra ...string) string {
	t.Helper()
	vars := fmt.Sprintf("fake = %q\nlogs = %q\nport = %d\nfaults = %q\n", fakeSGLang(t), logs, port, faults)
	for _, e := range extra {
		vars += e + "\n"
	}
	p := filepath.Join(dir, "plan.hcl")
	if err := os.WriteFile(p, []byte(srvPlan), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plan.vars.hcl"), []byte(vars), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// 1(a) and 1(b): a state directory owned by nobody, where nobody planted a lock symlink
// to a root file and forged a record naming an unrelated root process. The agent refuses
// the directory with the fix: the root file keeps its content and the process lives.
func TestAgentRefusesAStateDirAnotherUserControls(t *testing.T) {
	t.Parallel()
	base := restest.ReachableDir(t)
	testbin.NoLeaks(t, base)
	precious := filepath.Join(base, "precious")
	const content = "root's own file\n"
	os.WriteFile(precious, []byte(content), 0o644)

	victim := exec.Command("sleep", "300")
	victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	go victim.Wait()
	t.Cleanup(func() { victim.Process.Kill() })
	vid, err := proc.FS{}.Identify(victim.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	stateDir := filepath.Join(base, "state")
	os.Mkdir(stateDir, 0o755)
	os.Chown(stateDir, 65534, 65534)
	port := srvFreePort(t)
	restest.AsNobody(t, "", "ln", "-s", precious, filepath.Join(stateDir, "lock"))
	restest.AsNobody(t, "", "mkdir", filepath.Join(stateDir, "resources"))
	forged := fmt.Sprintf(`{"generation": 1, "pid": %d, "start_ticks": %d, "pgid": %d, "place": "host",
  "argv": ["sleep", "300"], "command": ["sleep"], "flags": {}, "workdir": "/", "port": %d, "launched_at": "2026-01-01T00:00:00Z"}`,
		vid.PID, vid.StartTicks, vid.PID, port)
	restest.AsNobody(t, forged, "sh", "-c", "cat > "+filepath.Join(stateDir, "resources", "server.qwen.json"))

	home := filepath.Join(base, "home")
	os.Mkdir(home, 0o700)
	t.Cleanup(func() { testbin.KillServers(base) }) // a server's HOME would be <state dir>/home
	plan := writeSrvPlan(t, base, filepath.Join(base, "logs"), port, "")
	for _, cmd := range []string{"plan", "apply", "status"} {
		code, out := runAgent(t, home, cmd, "--state-dir", stateDir, "-var-file", filepath.Join(base, "plan.vars.hcl"), plan)
		if code != 1 || !strings.Contains(out, "is owned by uid 65534") || !strings.Contains(out, "chown root:root "+stateDir) {
			t.Errorf("agent %s: exit %d, want 1 and the refusal with its fix:\n%s", cmd, code, out)
		}
	}
	if b, _ := os.ReadFile(precious); string(b) != content {
		t.Errorf("the lock symlink's target was written: %q", b)
	}
	if ok, _ := (proc.FS{}).Alive(vid); !ok {
		t.Error("the process a forged record named was killed")
	}
	if fi, _ := os.Stat(stateDir); fi.Mode().Perm() != 0o755 {
		t.Errorf("the refused state dir was changed to %v", fi.Mode().Perm())
	}
	if len(testbin.Servers(base)) != 0 {
		t.Error("a server was launched from an untrusted state dir")
	}
}

// The same rule for a server's log_dir: a log directory nobody owns (or under a parent
// nobody owns) is refused before anything is launched.
func TestServerRefusesALogDirAnotherUserControls(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	for _, tc := range []struct{ name, logs, culprit string }{
		{"owned by nobody", filepath.Join(h.dir, "a", "logs"), filepath.Join(h.dir, "a", "logs")},
		{"under nobody's dir", filepath.Join(h.dir, "b", "sub", "logs"), filepath.Join(h.dir, "b")},
	} {
		os.MkdirAll(tc.logs, 0o755)
		os.Chown(tc.culprit, 65534, 65534)
		st := h.apply("logs=" + tc.logs)
		if st.Err == nil || !errors.Is(st.Err, trust.ErrUntrusted) || !strings.Contains(st.Err.Error(), "chown root:root "+tc.culprit) {
			t.Errorf("%s: apply = %v, want a refusal with the fix", tc.name, st.Err)
		}
		if ents, _ := os.ReadDir(tc.logs); len(ents) != 0 {
			t.Errorf("%s: the agent wrote into it: %v", tc.name, ents)
		}
	}
	if _, err := h.store.Load("server.qwen", new(serverRecord)); err != nil {
		t.Fatal(err)
	}
}

// Point 9: ".." in log_dir is refused, not silently cleaned (download/trust_test.go: in
// dest).
func TestDotDotRefusedInLogDir(t *testing.T) {
	t.Parallel()
	_, diags := restest.BindPlan(`server "s" {
  command = ["x"]
  log_dir = "/var/log/agent/../../../etc"
}
`, kinds())
	var msg string
	for _, d := range diags {
		msg += d.Summary + ": " + d.Detail + "\n"
	}
	for _, want := range []string{"log_dir with ..", "(/etc)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, msg)
		}
	}
}

// Point 2: a process of another user running the plan's exact command line, environment
// and port is not adopted: the user is part of the identity. Without takeover the agent
// names it and leaves it alone; nothing is recorded as this server's.
func TestServerNeverAdoptsAnotherUsersProcess(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	launched := h.record()
	h.kill()
	_ = h.store.Delete("server.qwen")

	argv := append([]string{"--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"}, launched.Argv...)
	own := exec.Command("setpriv", argv...)
	own.Env = []string{"FAKE_SGLANG=", "FAKE_SGLANG_DECODE_INTERVAL=100ms"}
	own.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	go own.Wait()
	t.Cleanup(func() { _ = syscall.Kill(-own.Process.Pid, syscall.SIGKILL) })
	oid := waitPortOwner(t, h.port)
	for _, st := range []*agent.Step{h.plan(), h.apply()} {
		if st.Err == nil || !strings.Contains(st.Err.Error(), fmt.Sprintf("held by pid %d", oid.PID)) || !strings.Contains(st.Err.Error(), "(uid 65534)") {
			t.Errorf("err = %v, want the port holder named with its uid", st.Err)
		}
	}
	if ok, _ := h.store.Load("server.qwen", new(serverRecord)); ok {
		t.Error("another user's process was recorded as this server's")
	}
	if !alive(oid) {
		t.Error("another user's process was signalled without takeover")
	}
}

// Point 9: a flag's edges. An empty flag name is refused; a port given as a string is
// read as that port, or refused when it is not one; a number beyond float64 is refused;
// 1e300 renders as the float it is, not as 301 digits of a binary approximation.
func TestServerFlagEdges(t *testing.T) {
	t.Parallel()
	bind := func(flags string) (*Server, string) {
		rs, diags := restest.BindPlan("server \"s\" {\n  command = [\"x\"]\n  flags = "+flags+"\n}\n", kinds())
		var msg string
		for _, d := range diags {
			msg += d.Summary + ": " + d.Detail + "\n"
		}
		s, _ := rs["server.s"].(*Server)
		return s, msg
	}
	for _, tc := range []struct{ flags, want string }{
		{`{ "" = 1 }`, "empty flag name"},
		{`{ "--" = true }`, "empty flag name"},
		{`{ port = "30k" }`, `flags["port"] = "30k" is not a TCP port`},
		{`{ port = 70000 }`, `flags["port"] = 70000 is not a TCP port`},
		{`{ port = 1.5 }`, `is not a TCP port`},
		{`{ x = 1e400 }`, `flags["x"] is beyond what the server can read`},
	} {
		if _, msg := bind(tc.flags); !strings.Contains(msg, tc.want) {
			t.Errorf("flags = %s: diagnostics %q, want %q", tc.flags, msg, tc.want)
		}
	}
	s, msg := bind(`{ port = "30000", x = 1e300, y = 12345678901234567890 }`)
	if s == nil {
		t.Fatal(msg)
	}
	if s.port != 30000 || !strings.Contains(strings.Join(s.argv(), " "), "--port 30000 --x 1e+300 --y 12345678901234567890") {
		t.Errorf("port %d, argv %q", s.port, s.argv())
	}
}
