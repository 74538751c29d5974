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
