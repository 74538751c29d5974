package fleet_test

import (
	"bytes"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/docs/schema"
)

// background is a command started by the test in its own process group (an agent apply
// that the reboot hook ends), its output kept as it comes.
type background struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	pid    int
	exit   int // its exit code, once exited is closed
	exited chan struct{}
}

// code is the command's exit code (it must have exited).
func (b *background) code() int {
	<-b.exited
	return b.exit
}

func (b *background) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *background) out() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// kill SIGKILLs the command's process group (its hanging systemctl reboot with it).
func (b *background) kill() {
	syscall.Kill(-b.pid, syscall.SIGKILL)
	<-b.exited
}

func (b *background) done() bool {
	select {
	case <-b.exited:
		return true
	default:
		return false
	}
}

// agentStart starts `agent ARGS... PLAN` as x in the background.
func (h *harness) agentStart(x *host, args ...string) *background {
	h.t.Helper()
	b := &background{exited: make(chan struct{})}
	cmd := h.agentExec(x, args...)
	cmd.Stdout, cmd.Stderr = b, b
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	b.pid = cmd.Process.Pid
	go func() {
		cmd.Wait()
		b.exit = cmd.ProcessState.ExitCode()
		close(b.exited)
	}()
	h.t.Cleanup(func() {
		if !b.done() {
			b.kill()
		}
	})
	return b
}

// A driver change under agent apply (no agent run) takes the host permit before it
// stops anything: h2's apply takes the group's one permit and asks for its reboot; h1's
// apply then waits, naming h2 and what disrupts it, with its server serving and its
// driver untouched; h2's apply in its new boot relaunches its server, verifies every
// resource and releases the permit (saying so, its --json document still valid); h1's
// apply then takes the permit and upgrades, and its own apply after the reboot releases it.
func TestApplyTakesTheHostPermitAndWaitsForIt(t *testing.T) {
	u := newUpgrade(t, 2)
	h1, h2 := u.hosts[0], u.hosts[1]
	u.writePlan(driverOld)
	for _, x := range u.hosts {
		if code, out := u.agentCmd(x, "apply"); code != 0 || !x.serves() {
			t.Fatalf("apply %s on driver %s: exit %d\n%s", x.name, driverOld, code, out)
		}
	}
	u.writePlan(driverNew)
	a2 := u.agentStart(h2, "apply")
	u.waitFor("h2's apply asks for its reboot", time.Minute, func() bool { return u.rebootAsked(h2) })
	if ps := u.hostPermits(); len(ps) != 1 || !strings.Contains(ps[0], "/all/holders/h2 ") || !strings.Contains(ps[0], `"state":"rebooting"`) {
		t.Fatalf("host permits when h2 asked for its reboot: %q\n%s", ps, a2.out())
	}
	a2.kill()
	u.goDown(h2)

	pid1 := h1.serverPID()
	a1 := u.agentStart(h1, "apply")
	want := "nvidia_driver.host: waiting for a host permit in group all: held by h2 (driver " + driverOld + " → " + driverNew + ", rebooting since "
	u.waitFor("h1's apply says it waits for h2", 30*time.Second, func() bool { return strings.Contains(a1.out(), want) })
	time.Sleep(3 * time.Second) // three more asks
	if a1.done() || !h1.serves() || h1.serverPID() != pid1 || u.loaded(h1) != driverOld || u.rebootAsked(h1) {
		t.Fatalf("h1's apply did not wait with everything in place (exited %v, serves %v, pid %d → %d, driver %s):\n%s",
			a1.done(), h1.serves(), pid1, h1.serverPID(), u.loaded(h1), a1.out())
	}
	if n := strings.Count(a1.out(), "waiting for a host permit"); n != 1 {
		t.Errorf("h1's apply said %d times that it waits (want once while nothing changes):\n%s", n, a1.out())
	}

	// h2 comes back on the new driver: its apply in the new boot releases the permit.
	u.boot(h2, driverNew)
	code, stdout, stderr := u.agentOut(h2, "apply", "--json")
	if code != 0 || !strings.Contains(stderr, "Host permit of group all released: this host runs in a new boot and every resource of the plan is verified.") || !h2.serves() {
		t.Fatalf("apply on h2 after its reboot: exit %d, serves %v\nstdout:\n%s\nstderr:\n%s", code, h2.serves(), stdout, stderr)
	}
	if err := schema.Validate([]byte(stdout)); err != nil {
		t.Errorf("apply --json does not match docs/schema: %v\n%s", err, stdout)
	}

	// h1's apply goes on: it takes the permit, installs and asks for its reboot.
	u.waitFor("h1's apply asks for its reboot once h2 released", time.Minute, func() bool { return u.rebootAsked(h1) })
	if !strings.Contains(a1.out(), "nvidia_driver.host: host permit in group all taken after ") {
		t.Errorf("h1's apply does not say it took the permit:\n%s", a1.out())
	}
	if ps := u.hostPermits(); len(ps) != 1 || !strings.Contains(ps[0], "/all/holders/h1 ") {
		t.Fatalf("host permits when h1 asked for its reboot: %q", ps)
	}
	a1.kill()
	u.goDown(h1)
	u.boot(h1, driverNew)
	if code, out := u.agentCmd(h1, "apply"); code != 0 || !strings.Contains(out, "Host permit of group all released") || !h1.serves() || h1.serverPID() == pid1 {
		t.Fatalf("apply on h1 after its reboot: exit %d, serves %v\n%s", code, h1.serves(), out)
	}
	if ps := u.hostPermits(); len(ps) != 0 {
		t.Fatalf("host permits left: %q", ps)
	}
}
