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
	cmd.Stdout, cmd.Stderr = b, b // in a process group of its own (agentExec)
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

// applyToReboot applies the plan on driverOld on every host (each serving), then the
// plan on driverNew on x in the background, until x's apply asks for its reboot.
func (u *upgrade) applyToReboot(x *host) *background {
	u.t.Helper()
	u.writePlan(driverOld)
	for _, y := range u.hosts {
		if code, out := u.agentCmd(y, "apply"); code != 0 || !y.serves() {
			u.t.Fatalf("apply %s on driver %s: exit %d\n%s", y.name, driverOld, code, out)
		}
	}
	u.writePlan(driverNew)
	a := u.agentStart(x, "apply")
	u.waitFor(x.name+"'s apply asks for its reboot", time.Minute, func() bool { return u.rebootAsked(x) })
	return a
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
	a2 := u.applyToReboot(h2)
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

// agent apply in the host's new boot records a failed verification in its host permit,
// as agent run does: h2 comes back from its driver reboot still on the old driver (the
// reboot did not help), its apply says it keeps the permit and why, the permit records
// the verify failure, the host group stops fleet-wide (agent status --fleet names it,
// exit 3) and h1's apply is refused with it. Booted again on the new driver, h2's apply
// verifies it and releases the permit.
func TestApplyRecordsAFailedVerification(t *testing.T) {
	u := newUpgrade(t, 2)
	h1, h2 := u.hosts[0], u.hosts[1]
	a2 := u.applyToReboot(h2)
	a2.kill()
	u.goDown(h2)
	u.boot(h2, driverOld)
	code, stdout, stderr := u.agentOut(h2, "apply", "--json")
	if code != 1 {
		t.Errorf("apply on h2 back on %s: exit %d, want 1 (its verification failed)\nstderr:\n%s", driverOld, code, stderr)
	}
	if f := u.hostFailure(h2); !strings.Contains(f, `"step":"verify"`) || !strings.Contains(f, "nvidia_driver.host: ") {
		t.Fatalf("h2's permit does not record its failed verification: %s", u.hostPermits()[0])
	}
	want := "Host permit of group all: host h2 keeps its host permit (h2 verifying since "
	if n := strings.Count(stderr, want); n != 1 || strings.Count(stderr, "the reboot did not help") != 1 ||
		!strings.Contains(stderr, "this stops the host group fleet-wide until this host is verified") || strings.Contains(stdout, "Host permit") {
		t.Errorf("apply --json says %d times on stderr %q (want once, the driver's failure quoted once, stdout the document alone):\n%s", n, want, stderr)
	}
	if err := schema.Validate([]byte(stdout)); err != nil {
		t.Errorf("apply --json does not match docs/schema: %v\n%s", err, stdout)
	}
	doc, text := u.fleetStatus(h1)
	if hp, _ := doc["fleet"].(map[string]any)["host_permits"].([]any); len(hp) != 1 {
		t.Errorf("status --fleet does not show h2's permit:\n%s", text)
	} else if f, _ := hp[0].(map[string]any)["failure"].(map[string]any); f["step"] != "verify" || !strings.Contains(f["error"].(string), "the reboot did not help") {
		t.Errorf("status --fleet does not show h2's failed verification:\n%s", text)
	}
	a1 := u.agentStart(h1, "apply")
	u.waitFor("h1's apply says the host group is stopped", 30*time.Second, func() bool {
		return strings.Contains(a1.out(), "host group all is stopped: h2 failed at verify")
	})
	if u.rebootAsked(h1) || u.loaded(h1) != driverOld || !h1.serves() {
		t.Fatalf("h1 went on while h2 failed:\n%s", a1.out())
	}
	a1.kill()

	// h2 reboots again, onto the new driver: its apply verifies it and releases.
	u.goDown(h2)
	u.boot(h2, driverNew)
	if code, out := u.agentCmd(h2, "apply"); code != 0 || !strings.Contains(out, "Host permit of group all released") || !h2.serves() {
		t.Fatalf("apply on h2 on %s: exit %d\n%s", driverNew, code, out)
	}
	if ps := u.hostPermits(); len(ps) != 0 {
		t.Fatalf("host permits left: %q", ps)
	}
}
