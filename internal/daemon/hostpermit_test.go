package daemon

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/coord/etcdtest"
)

// At boot, agent run finds the host permit its host recorded before rebooting: kept in
// the boot it rebooted from (the reboot has not happened), kept while a resource is not
// verified (one that fails records the failed verify in the permit, once, which stops
// the host group), released once every resource is, in the new boot. A second host is
// refused with kpro6 named until then.
func TestBootReleasesTheHostPermitOnceVerified(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	open := func(host string) *coord.Client {
		c, err := coord.Open(coord.Config{Endpoints: cl.Endpoints(), Prefix: "/agent/d", Lease: 2 * time.Second, Host: host})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		waitFor(t, host+"'s lease", func() bool { _, _, _, err := c.LeaseState(); return err == nil })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// kpro6's agent, before its reboot (the driver's Rebooting): taken, then recorded.
	pre := open("kpro6")
	req := coord.HostRequest{Group: "gpu-hosts", Max: 1, Cause: "driver", Detail: "driver 580.95.05 → 590.48.01", BootID: "boot-1"}
	if _, err := pre.TakeHost(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := pre.UpdateHost(ctx, "gpu-hosts", func(p *coord.HostPermit) { p.State, p.RebootID = coord.HostRebooting, "boot-1" }); err != nil {
		t.Fatal(err)
	}
	pre.Abandon()
	kpro7 := open("kpro7")
	held := func() *coord.HostPermit {
		t.Helper()
		ps, err := kpro7.HostPermits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Host == "kpro6" {
				return &p
			}
		}
		return nil
	}
	plan := func(fail bool) string {
		return fmt.Sprintf(`variable "root" {}
agent {
  coordination {
    etcd   = [%q]
    prefix = "/agent/d"
    lease  = "2s"
    name   = "kpro6"
    host_disruptions {
      group = "gpu-hosts"
    }
  }
}
mark "a" {
  path  = "${var.root}/a"
  value = "1"
  fail  = %v
}
`, cl.Endpoints()[0], fail)
	}
	var boot atomic.Value
	boot.Store("boot-1")
	tune := func(h *harness, c *Config) {
		c.BootID = func() string { return boot.Load().(string) }
		c.BackoffMin, c.BackoffMax = 200*time.Millisecond, time.Second
	}

	// The agent restarted before the reboot happened: the permit stays.
	h := startTuned(t, plan(false), 500*time.Millisecond, tune)
	waitFor(t, "the permit kept in the boot it rebooted from", func() bool { return strings.Contains(h.log.String(), "host permit kept") })
	if p := held(); p == nil || p.State != coord.HostRebooting {
		t.Fatalf("kpro6's permit in the same boot: %+v", p)
	}
	h.cancel()

	// After the reboot, a resource failing: kept, its verification failed (recorded once
	// however often the loop asks again), kpro7 refused with the failure named, even
	// with room for two. The interval is long: the permit is asked about again as the
	// loop's steps settle, not an interval later.
	boot.Store("boot-2")
	h = startTuned(t, plan(true), 20*time.Second, tune)
	waitFor(t, "the failed verify recorded", func() bool { p := held(); return p != nil && p.Failure != nil })
	first := held()
	time.Sleep(3 * time.Second)
	p := held()
	if p == nil || p.State != coord.HostFailed || p.Failure.Step != coord.StepVerify || !strings.Contains(p.Failure.Error, "mark.a") || !p.Updated.Equal(first.Updated) {
		t.Fatalf("kpro6's permit while mark.a fails: %+v (failure %+v, first written %s)\n%s", p, p.Failure, first.Updated, h.log.String())
	}
	if n := strings.Count(h.log.String(), "host disruption failed at verify: the host group is stopped"); n != 1 {
		t.Errorf("the failed verify is logged %d times, want once:\n%s", n, h.log.String())
	}
	if _, err := kpro7.TakeHost(ctx, coord.HostRequest{Group: "gpu-hosts", Max: 2, Cause: "drain"}); err == nil || !strings.Contains(err.Error(), "host group gpu-hosts is stopped: kpro6 failed at verify: ") {
		t.Fatalf("kpro7 while kpro6's verification failed: %v", err)
	}
	// Fixed: verified, released at once (not at the next interval, 20 s).
	fixed := time.Now()
	h.write(t, plan(false))
	waitFor(t, "the permit released once verified", func() bool { return held() == nil })
	if d := time.Since(fixed); d > 8*time.Second {
		t.Errorf("the permit was released %s after the fix, want within a few seconds of the resource verified (the interval is 20 s)", d.Round(100*time.Millisecond))
	}
	// Logged once etcd answered the release: the test may read etcd first.
	waitFor(t, "the release logged", func() bool {
		return strings.Contains(h.log.String(), "host disruption over: driver and servers verified, host permit released")
	})
	if _, err := kpro7.TakeHost(ctx, coord.HostRequest{Group: "gpu-hosts", Max: 1, Cause: "drain"}); err != nil {
		t.Fatalf("kpro7 after kpro6's release: %v", err)
	}
}
