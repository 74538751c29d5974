package testbin

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestBuildsOnceAndSweepsDeadProcesses(t *testing.T) {
	// Leftovers in the shared temporary directory: a gone test process's directory (its
	// lock file held by nobody), a live one's in another PID namespace (held by a child
	// here, as that process would hold it), one being created (no lock file yet). The
	// first build sweeps; sweep is called here too, as with -count=N only the first run
	// builds.
	mk := func(lock bool) string {
		d, err := os.MkdirTemp("", "agent-testbin-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		if lock {
			if err := os.WriteFile(filepath.Join(d, lockName), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	gone, live, creating := mk(true), mk(true), mk(false)
	holder := exec.Command("flock", "--shared", filepath.Join(live, lockName), "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	for i := 0; ; i++ { // flock(1) takes the lock after it starts
		f, _ := os.Open(filepath.Join(live, lockName))
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close()
		if err != nil {
			break
		}
		if i == 100 {
			t.Fatal("flock(1) never took the lock")
		}
		time.Sleep(20 * time.Millisecond)
	}

	a, b := FakeSGLang(t), FakeSGLang(t)
	if a != b {
		t.Errorf("built twice: %s, %s", a, b)
	}
	sweep()
	for _, c := range []struct {
		dir  string
		kept bool
	}{{gone, false}, {live, true}, {creating, true}, {filepath.Dir(a), true}} {
		_, err := os.Stat(c.dir)
		if kept := err == nil; kept != c.kept {
			t.Errorf("%s: kept = %v, want %v (%v)", c.dir, kept, c.kept, err)
		}
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

// NoLeaks finds a process by what it holds under the test's directory (here its working
// directory, with a HOME elsewhere: the case the old clean-up missed), kills it, and
// fails the test; with nothing left it passes.
func TestNoLeaksFindsKillsAndFails(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "state", "home")
	os.MkdirAll(sub, 0o755)
	p := exec.Command("sleep", "300")
	p.Dir = sub
	p.Env = []string{"HOME=/nonexistent"}
	p.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.Wait(); close(done) }()
	left := Leftovers(dir)
	if len(left) != 1 || left[0].PID != p.Process.Pid || !strings.Contains(left[0].Why, "cwd") {
		t.Fatalf("Leftovers = %v, want pid %d by its cwd", left, p.Process.Pid)
	}
	err := KillLeft(dir)
	if err == nil || !strings.Contains(err.Error(), strconv.Itoa(p.Process.Pid)) {
		t.Fatalf("KillLeft = %v, want an error naming pid %d", err, p.Process.Pid)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the leftover was not killed")
	}
	if err := KillLeft(dir); err != nil {
		t.Errorf("nothing left, yet: %v", err)
	}
	// The test's own process holds files under its directory; it is never counted.
	f, _ := os.Create(filepath.Join(dir, "held"))
	defer f.Close()
	if left := Leftovers(dir); len(left) != 0 {
		t.Errorf("Leftovers counted this process: %v", left)
	}
}

// The watch counts a refused port and a non-200 /health as down, and keeps the peak.
func TestWatchHealthKeepsThePeak(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(status.Load())) }))
	defer up.Close()
	upPort := up.Listener.Addr().(*net.TCPAddr).Port
	refused := FreePort(t)
	w := WatchHealth([]int{upPort, refused}, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	changed := time.Now()
	status.Store(http.StatusServiceUnavailable)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		peak := w.res.Peak
		w.mu.Unlock()
		if peak == 2 || time.Now().After(deadline) {
			break
		}
	}
	r := w.Stop()
	if r.Peak != 2 || len(r.PeakDown) != 2 || r.Downs[refused] < r.Downs[upPort] || r.Downs[upPort] == 0 || r.Samples < 2 {
		t.Errorf("want both ports down at the peak, the refused one in every sample: %+v", r)
	}
	// The outage spans: the refused port from the first round, the other from the change.
	if f, l := r.FirstDown[refused], r.LastDown[refused]; f.IsZero() || f.After(changed) || l.Before(r.PeakTime) {
		t.Errorf("the refused port's outage: first %s, last %s, changed at %s, peak at %s", f, l, changed, r.PeakTime)
	}
	if f, l := r.FirstDown[upPort], r.LastDown[upPort]; f.Before(changed) || l.Before(f) {
		t.Errorf("the 503 port's outage: first %s, last %s, changed at %s", f, l, changed)
	}
	if !strings.HasPrefix(r.PeakAt(), fmt.Sprintf("ports %v at ", r.PeakDown)) {
		t.Errorf("PeakAt = %q", r.PeakAt())
	}
}

// TestFreePortStaysOutOfTheEphemeralRange: a port handed to a test is one no outgoing
// connection can hold already (below the kernel's ephemeral range), listenable, and never
// handed out twice by one test binary.
func TestFreePortStaysOutOfTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for range 50 {
		p := FreePort(t)
		if p >= low {
			t.Fatalf("port %d lies in the ephemeral range (from %d)", p, low)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("port %d is not free: %v", p, err)
		}
		ln.Close()
	}
}
