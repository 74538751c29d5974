package fleet

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord/etcdtest"
)

// Under agent apply a refused host permit is a wait: the gate asks again every second,
// says once who holds the group's permit (not again while nothing changes), takes it as
// soon as the holder releases it, and says so. Bounded, it ends with what to do; an
// ended context ends it at once.
func TestHostGateWaitsNamingTheHolder(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := client(t, cl, "kpro6", false)
	b := client(t, cl, "kpro7", false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ga, gb := NewHostGate(func() string { return "boot-a" }), NewHostGate(func() string { return "boot-b" })
	ga.Attach(a, hostPlan())
	gb.Attach(b, hostPlan())
	if err := ga.Begin(ctx, "driver", "driver 570.172.08 → 580.95.05"); err != nil {
		t.Fatal(err)
	}
	if err := ga.Rebooting(ctx, "reboot", "driver 570.172.08 → 580.95.05", "boot-a"); err != nil {
		t.Fatal(err)
	}
	p, _ := a.MyHostPermit(ctx, "gpu-hosts")

	gb.WaitWhileHeld(time.Minute)
	var mu sync.Mutex
	var said []string
	wctx := WithHostWait(ctx, func(s string) { mu.Lock(); said = append(said, s); mu.Unlock() })
	done := make(chan error, 1)
	go func() { done <- gb.Begin(wctx, "driver", "driver 570.172.08 → 580.95.05") }()
	select {
	case err := <-done:
		t.Fatalf("kpro7's gate did not wait while kpro6 held the permit: %v", err)
	case <-time.After(3 * time.Second):
	}
	want := "waiting for a host permit in group gpu-hosts: held by kpro6 (driver 570.172.08 → 580.95.05, rebooting since " +
		p.Since.Local().Format("15:04") + ")"
	mu.Lock()
	if len(said) != 1 || said[0] != want {
		t.Errorf("while waiting it said %q, want once %q", said, want)
	}
	mu.Unlock()
	released := time.Now()
	if err := a.ReleaseHost(ctx, "gpu-hosts"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kpro7's gate once kpro6 released: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("kpro7's gate still waits 5 s after kpro6 released its permit")
	}
	if d := time.Since(released); d > 2*HostAskEvery+time.Second {
		t.Errorf("kpro7 took the permit %s after its release", d)
	}
	mu.Lock()
	if last := said[len(said)-1]; !strings.HasPrefix(last, "host permit in group gpu-hosts taken after ") {
		t.Errorf("it did not say it took the permit: %q", said)
	}
	mu.Unlock()
	if hp, _ := b.MyHostPermit(ctx, "gpu-hosts"); hp == nil || hp.Cause != "driver" {
		t.Fatalf("kpro7's permit: %+v", hp)
	}

	// kpro6 now waits for kpro7: bounded, the error names the holder and the fix.
	ga.WaitWhileHeld(1500 * time.Millisecond)
	err := ga.Begin(ctx, "driver", "x")
	if err == nil || !strings.Contains(err.Error(), "no host permit in group gpu-hosts after 1.5s (held by kpro7 (driver 570.172.08 → 580.95.05, stopping since") ||
		!strings.Contains(err.Error(), "agent status --fleet") || !strings.Contains(err.Error(), "agent fleet release HOST PLAN") {
		t.Fatalf("a bounded wait: %v", err)
	}
	ga.WaitWhileHeld(time.Minute)
	cctx, ccancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer ccancel()
	start := time.Now()
	if err := ga.Begin(cctx, "driver", "x"); err == nil || !strings.Contains(err.Error(), "stopped waiting for a host permit in group gpu-hosts (held by kpro7") ||
		time.Since(start) > 5*time.Second {
		t.Fatalf("an ended context: %v after %s", err, time.Since(start))
	}
}
