package fleet

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/coord/etcdtest"
	"github.com/agent-dev/agent/plans"
)

func hostPlan() *plans.Plan {
	return &plans.Plan{Agent: plans.AgentSettings{Coordination: &plans.Coordination{
		HostDisruptions: plans.HostDisruptions{MaxUnavailable: 1, Group: "gpu-hosts"}}}}
}

// A host's disruption ends only after its reboot (another boot id) and once verify says
// its driver and servers serve; the permit holds until then, and a drain is not ended here.
func TestFinishHostAfterANewBootAndVerified(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := client(t, cl, "kpro6", false)
	b := client(t, cl, "kpro7", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.TakeHost(ctx, HostRequest(hostPlan(), "driver", "driver 580.95.05 → 590.48.01", "boot-1")); err != nil {
		t.Fatal(err)
	}
	if err := a.UpdateHost(ctx, "gpu-hosts", func(p *coord.HostPermit) { p.State, p.RebootID = coord.HostRebooting, "boot-1" }); err != nil {
		t.Fatal(err)
	}
	asked := 0
	verify := func(err error) func(context.Context, coord.HostPermit) error {
		return func(context.Context, coord.HostPermit) error { asked++; return err }
	}
	// Still in the boot it rebooted from: the reboot has not happened.
	released, pending, err := FinishHost(ctx, a, "gpu-hosts", "boot-1", verify(nil))
	if err != nil || released || pending == nil || asked != 0 {
		t.Fatalf("same boot: released %v, pending %v, err %v, verify asked %d times", released, pending, err, asked)
	}
	// A new boot, a server not serving yet: kept, with why.
	_, _, err = FinishHost(ctx, a, "gpu-hosts", "boot-2", verify(errors.New("server.qwen: not ready")))
	if err == nil || !strings.Contains(err.Error(), "keeps its host permit") || !strings.Contains(err.Error(), "server.qwen: not ready") {
		t.Fatalf("not verified: %v", err)
	}
	if _, err := b.TakeHost(ctx, HostRequest(hostPlan(), "drain", "", "x")); err == nil || !strings.Contains(err.Error(), "kpro6 verifying since") {
		t.Fatalf("kpro7 while kpro6 verifies: %v", err)
	}
	released, _, err = FinishHost(ctx, a, "gpu-hosts", "boot-2", verify(nil))
	if err != nil || !released {
		t.Fatalf("verified: released %v, %v", released, err)
	}
	if _, err := b.TakeHost(ctx, HostRequest(hostPlan(), "drain", "hardware", "x")); err != nil {
		t.Fatalf("kpro7 after kpro6 released: %v", err)
	}
	// A drain is ended by agent drain --undo, not by a restart of the agent.
	released, pending, err = FinishHost(ctx, b, "gpu-hosts", "y", verify(nil))
	if err != nil || released || pending == nil || pending.Cause != "drain" {
		t.Fatalf("a drain: released %v, pending %v, %v", released, pending, err)
	}
}

// The driver kind's gate: nothing asked before the fleet is joined (or without
// coordination); joined, Begin takes the host permit and Rebooting records the boot the
// host reboots from; another host's gate is refused with kpro6 named.
func TestHostGateTakesAndRecordsTheReboot(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := client(t, cl, "kpro6", false)
	b := client(t, cl, "kpro7", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, gb := NewHostGate(func() string { return "boot-a" }), NewHostGate(func() string { return "boot-b" })
	if err := ga.Begin(ctx, "driver", "driver 580.95.05 → 590.48.01"); err != nil {
		t.Fatalf("a gate not attached: %v", err)
	}
	if ps, _ := a.HostPermits(ctx); len(ps) != 0 {
		t.Fatalf("a gate not attached took %+v", ps)
	}
	ga.Attach(a, hostPlan())
	gb.Attach(b, hostPlan())
	if err := ga.Begin(ctx, "driver", "driver 580.95.05 → 590.48.01"); err != nil {
		t.Fatal(err)
	}
	if err := ga.Rebooting(ctx, "reboot", "driver 580.95.05 → 590.48.01: installed 590.48.01, loaded 580.95.05", "boot-a"); err != nil {
		t.Fatal(err)
	}
	p, err := a.MyHostPermit(ctx, "gpu-hosts")
	if err != nil || p == nil || p.State != coord.HostRebooting || p.RebootID != "boot-a" || p.BootID != "boot-a" || p.Cause != "driver" {
		t.Fatalf("kpro6's permit: %+v, %v", p, err)
	}
	if err := gb.Begin(ctx, "driver", "x"); err == nil || !strings.Contains(err.Error(), "kpro6 rebooting since") {
		t.Fatalf("kpro7's gate: %v", err)
	}
}

// After its reboot a host whose server does not serve again (verify says VerifyFailure)
// records the verify step in its permit, once per distinct error, and stops the group
// although max_unavailable would let kpro7 start; a verify still on its way (any other
// error) records nothing; once verified the permit is released and the group goes on.
func TestFinishHostRecordsAFailedVerify(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := client(t, cl, "kpro6", false)
	b := client(t, cl, "kpro7", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	two := hostPlan()
	two.Agent.Coordination.HostDisruptions.MaxUnavailable = 2
	if _, err := a.TakeHost(ctx, HostRequest(two, "driver", "driver 580.95.05 → 590.48.01", "boot-1")); err != nil {
		t.Fatal(err)
	}
	if err := a.UpdateHost(ctx, "gpu-hosts", func(p *coord.HostPermit) { p.State, p.RebootID = coord.HostRebooting, "boot-1" }); err != nil {
		t.Fatal(err)
	}
	finish := func(verr error) error {
		t.Helper()
		released, _, err := FinishHost(ctx, a, "gpu-hosts", "boot-2", func(context.Context, coord.HostPermit) error { return verr })
		if released {
			t.Fatalf("released while verify says %v", verr)
		}
		return err
	}
	// On its way: not a failure.
	finish(errors.New("server.qwen: not verified healthy yet"))
	if p, _ := a.MyHostPermit(ctx, "gpu-hosts"); p.Failure != nil || p.State != coord.HostVerifying {
		t.Fatalf("a verify on its way recorded %+v", p)
	}
	if _, err := b.TakeHost(ctx, HostRequest(two, "drain", "", "x")); err != nil {
		t.Fatalf("kpro7 while kpro6 verifies (room for two): %v", err)
	}
	if err := b.ReleaseHost(ctx, "gpu-hosts"); err != nil {
		t.Fatal(err)
	}
	failed := &VerifyFailure{Err: errors.New("server.qwen: exited with status 1 before it was ready: CUDA error: no CUDA-capable device is detected")}
	if err := finish(failed); err == nil || !strings.Contains(err.Error(), "no CUDA-capable device") {
		t.Fatalf("failed verify: %v", err)
	}
	p, _ := a.MyHostPermit(ctx, "gpu-hosts")
	if p.State != coord.HostFailed || p.Failure == nil || p.Failure.Step != coord.StepVerify || p.Failure.BootID != "boot-2" || p.Failure.Error != failed.Err.Error() {
		t.Fatalf("kpro6's permit after a failed verify: %+v (failure %+v)", p, p.Failure)
	}
	// Asked again every pass: the same failure is not written again.
	finish(failed)
	if again, _ := a.MyHostPermit(ctx, "gpu-hosts"); !again.Updated.Equal(p.Updated) {
		t.Fatalf("the same failed verify rewrote the permit (updated %s, was %s)", again.Updated, p.Updated)
	}
	if _, err := b.TakeHost(ctx, HostRequest(two, "drain", "", "x")); err == nil || !strings.Contains(err.Error(), `kpro6 failed at verify: "server.qwen: exited`) {
		t.Fatalf("kpro7 while kpro6 failed: %v", err)
	}
	released, _, err := FinishHost(ctx, a, "gpu-hosts", "boot-2", func(context.Context, coord.HostPermit) error { return nil })
	if err != nil || !released {
		t.Fatalf("verified: released %v, %v", released, err)
	}
	if _, err := b.TakeHost(ctx, HostRequest(two, "drain", "", "x")); err != nil {
		t.Fatalf("kpro7 after kpro6 was verified: %v", err)
	}
}

// A verify that fails after an earlier step of the same boot failed (the install) keeps
// that step as the cause: what is left unverified is its consequence.
func TestFinishHostKeepsTheEarlierStepsFailure(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := client(t, cl, "kpro6", false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := NewHostGate(func() string { return "boot-1" })
	g.Attach(a, hostPlan())
	if err := g.Failed(ctx, "install", errors.New("no permit, nothing recorded")); err != nil {
		t.Fatal(err)
	}
	if err := g.Begin(ctx, "driver", "driver 580.95.05 → 590.48.01"); err != nil {
		t.Fatal(err)
	}
	if err := g.Failed(ctx, "upgrade", errors.New("x")); err == nil || !strings.Contains(err.Error(), `unknown step "upgrade"`) {
		t.Fatalf("an unknown step: %v", err)
	}
	if err := g.Failed(ctx, "install", errors.New("installer failed: exit status 1")); err != nil {
		t.Fatal(err)
	}
	// The agent restarts in the same boot: its verify fails for the same cause.
	_, _, err := FinishHost(ctx, a, "gpu-hosts", "boot-1", func(context.Context, coord.HostPermit) error {
		return &VerifyFailure{Err: errors.New("nvidia_driver.host: installer failed: exit status 1")}
	})
	if err == nil {
		t.Fatal("a failed verify released the permit")
	}
	p, _ := a.MyHostPermit(ctx, "gpu-hosts")
	if p.Failure == nil || p.Failure.Step != coord.StepInstall || p.State != coord.HostFailed || p.Failure.Error != "installer failed: exit status 1" {
		t.Fatalf("permit %+v (failure %+v): the install's failure was not kept", p, p.Failure)
	}
}

// A waiting agent apply says what stops the group when a host failed: the host, the
// step and the quoted error, not only that it holds a permit.
func TestWaitingForAStoppedGroupQuotesTheFailure(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 3, 10, 4, 0, 0, time.Local)
	failed := coord.HostPermit{Group: "gpu-hosts", Host: "kpro6", Cause: "driver", Detail: "driver 580.95.05 → 590.48.01", State: coord.HostFailed, Since: at,
		Failure: &coord.HostFailure{Step: coord.StepInstall, Error: "installer failed: exit status 1", At: at}}
	got := WaitingFor(&coord.HostRefusal{Group: "gpu-hosts", Max: 2, Holders: []coord.HostPermit{failed}, Failed: &failed})
	want := `waiting for a host permit in group gpu-hosts: host group gpu-hosts is stopped: kpro6 failed at install: "installer failed: exit status 1" since 10:04 (driver 580.95.05 → 590.48.01); fix kpro6 (it resumes by itself once verified) or agent fleet release kpro6 PLAN`
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
