package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/coord/etcdtest"
	"github.com/agent-dev/agent/internal/view"
)

func client(t *testing.T, cl *etcdtest.Cluster, host string, readOnly bool) *coord.Client {
	t.Helper()
	c, err := coord.Open(coord.Config{Endpoints: cl.Endpoints(), Prefix: "/agent/t", Lease: 2 * time.Second, Host: host, ReadOnly: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if !readOnly {
		waitFor(t, "a lease", func() bool { _, _, _, err := c.LeaseState(); return err == nil })
	}
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func group(t *testing.T, c *coord.Client) coord.Group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gs, err := c.Rollouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gs {
		if g.Name == "qwen" {
			return g
		}
	}
	return coord.Group{Name: "qwen"}
}

// Marks reach etcd in the background, survive a new lease (etcd down past the lease:
// the old keys are gone, the marks are written again), and go when released.
func TestPermitsRewriteMarksUnderANewLease(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	c, view := client(t, cl, "kpro5", false), client(t, cl, "viewer", true)
	p := NewPermits(c, nil)
	defer p.Close()
	p.Mark("qwen", "server.qwen", "gone")
	waitFor(t, "the mark in etcd", func() bool { g := group(t, view); return len(g.Permits) == 1 && g.Permits[0].Why == "gone" })
	_, _, gen, _ := c.LeaseState()
	cl.StopAll()
	waitFor(t, "the lease lapses", func() bool { _, _, _, err := c.LeaseState(); return err != nil })
	time.Sleep(3 * time.Second) // past the TTL at etcd too, once it is back
	cl.RestartAll()
	waitFor(t, "the mark under a live lease", func() bool {
		_, _, g, err := c.LeaseState()
		ps := group(t, view).Permits
		return err == nil && len(ps) == 1 && ps[0].Host == "kpro5" && (g > gen || ps[0].Why == "gone")
	})
	p.Release("server.qwen")
	waitFor(t, "the release", func() bool { return len(group(t, view).Permits) == 0 })
	if p.Held() {
		t.Error("Held after the release")
	}
}

// A failure stops the group until the member is released; a stop and a permit an
// earlier process of this host left are dropped once this one finds the member healthy.
func TestPermitsFailAndWhatAnEarlierProcessLeft(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	view := client(t, cl, "viewer", true)
	first := client(t, cl, "kpro5", false)
	p := NewPermits(first, nil)
	ctx := context.Background()
	if err := p.Take(ctx, "qwen", "server.qwen", "restart", 1); err != nil {
		t.Fatal(err)
	}
	p.Fail("qwen", "server.qwen", "exited: CUDA out of memory")
	p.Mark("qwen", "server.qwen", "failed: exited: CUDA out of memory")
	waitFor(t, "the stop", func() bool {
		g := group(t, view)
		return g.Stop != nil && len(g.Permits) == 1 && g.Permits[0].State == coord.Failed
	})

	other := NewPermits(client(t, cl, "kpro6", false), nil)
	defer other.Close()
	err := other.Take(ctx, "qwen", "server.qwen", "restart", 5)
	var ref *agent.FleetRefusal
	if !errors.As(err, &ref) || !ref.Stopped || ref.Host != "kpro5" || ref.Reason != "exited: CUDA out of memory" {
		t.Fatalf("another host's take: %v", err)
	}

	// The agent dies (its lease still runs); the next process finds the member healthy.
	p.Close()
	first.Abandon()
	next := NewPermits(client(t, cl, "kpro5", false), nil)
	defer next.Close()
	next.Release("server.qwen")
	waitFor(t, "the earlier process's permit and stop dropped", func() bool { g := group(t, view); return g.Stop == nil && len(g.Permits) == 0 })
	if err := other.Take(ctx, "qwen", "server.qwen", "restart", 1); err != nil {
		t.Fatalf("after the repair: %v", err)
	}
}

// The summary a host publishes, and the fleet view a lapsed host leaves.
func TestPublishAndRead(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	c, viewer := client(t, cl, "kpro5", false), client(t, cl, "viewer", true)
	rep := &agent.Report{Steps: []*agent.Step{
		{Addr: "server.qwen", Status: &agent.Status{Healthy: true, Summary: "running, ready, generation 4"}},
		{Addr: "file.token", Status: &agent.Status{Summary: "differs"}, Err: errors.New("file.token: write hunter22: permission denied")},
	}}
	inFlight := map[string]agent.InFlightMember{"server.qwen": {Group: "qwen", Action: "restart", Since: time.Unix(1700000000, 0).UTC()}}
	sum := SummaryOf("kpro5", "1.2.3", rep, inFlight, view.NewRedactor([]string{"hunter22"}))
	if sum.Healthy || sum.Resources[1].Healthy || !sum.Resources[0].Healthy || strings.Contains(sum.Resources[1].Error, "hunter22") || !strings.Contains(sum.Resources[1].Error, "permission denied") {
		t.Fatalf("summary %+v: unhealthy with the secret redacted expected", sum)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Publish(ctx, c, nil, func() Summary { return sum }); close(done) }()
	waitFor(t, "the host entry", func() bool {
		st, err := Read(context.Background(), viewer)
		return err == nil && len(st.Hosts) == 1 && st.Hosts[0].Reachable && st.Hosts[0].Summary != nil && len(st.Hosts[0].Summary.Rollouts) == 1
	})
	cancel()
	<-done
	c.Abandon()
	waitFor(t, "the host unreachable", func() bool {
		st, err := Read(context.Background(), viewer)
		return err == nil && len(st.Hosts) == 1 && !st.Hosts[0].Reachable && st.Degraded() && st.Hosts[0].Summary.Host == "kpro5"
	})
}

// A member that left every rollout group (its block left the plan) keeps nothing in
// etcd: Keep drops what this or an earlier process held for it.
func TestKeepDropsMembersThatLeftTheGroups(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	view := client(t, cl, "viewer", true)
	first := client(t, cl, "kpro5", false)
	p := NewPermits(first, nil)
	if err := p.Take(context.Background(), "qwen", "server.old", "restart", 1); err != nil {
		t.Fatal(err)
	}
	p.Close()
	first.Abandon()
	next := NewPermits(client(t, cl, "kpro5", false), nil)
	defer next.Close()
	next.Mark("qwen", "server.gone", "exited")
	waitFor(t, "two permits", func() bool { return len(group(t, view).Permits) == 2 })
	next.Keep([]string{"server.qwen"})
	waitFor(t, "both dropped", func() bool { return len(group(t, view).Permits) == 0 })
	if next.Held() {
		t.Error("Held after Keep dropped everything")
	}
}

// etcd stopped past the lease and started again with its data: a release made meanwhile
// reaches etcd within 2 s of etcd answering (it needs no lease), and a mark still held is
// confirmed again; until a mark is written again after its host's lease came back, the
// fleet's view calls it unconfirmed.
func TestReleaseAndConfirmWhenEtcdReturns(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	c, viewer := client(t, cl, "kpro5", false), client(t, cl, "viewer", true)
	p := NewPermits(c, nil)
	defer p.Close()
	if err := p.Take(context.Background(), "qwen", "server.a", "restart", 2); err != nil {
		t.Fatal(err)
	}
	p.Mark("qwen", "server.b", "exited")
	waitFor(t, "two permits", func() bool { return len(group(t, viewer).Permits) == 2 })

	cl.StopAll()
	waitFor(t, "the lease lapses", func() bool { _, _, _, err := c.LeaseState(); return err != nil })
	p.Release("server.a") // converged while etcd is down
	time.Sleep(2 * time.Second)
	// The host may confirm its mark before RestartAll returns (it did, 25 ms before,
	// once in six runs): a confirmation counts from the restart, the delay from when
	// etcd answered.
	restart := time.Now()
	cl.RestartAll()
	back := time.Now()
	waitFor(t, "server.a released, server.b confirmed", func() bool {
		ps := group(t, viewer).Permits
		return len(ps) == 1 && ps[0].Member == "server.b" && ps[0].Confirmed.After(restart)
	})
	d := time.Since(back)
	t.Logf("released and confirmed %s after etcd answered", d.Round(time.Millisecond))
	if d > 2*time.Second {
		t.Errorf("the release and the confirmation reached etcd %s after it answered; want within 2 s", d)
	}

	// The view: a permit written before its host's lease became live again (published
	// as the host entry's connected time) is unconfirmed until written again.
	raw := coord.Permit{}
	ctx := context.Background()
	pub, cancel := context.WithCancel(ctx)
	defer cancel()
	go Publish(pub, c, nil, func() Summary { return Summary{Host: "kpro5"} })
	waitFor(t, "the host entry", func() bool {
		st, err := Read(ctx, viewer)
		return err == nil && len(st.Hosts) == 1 && st.Hosts[0].Reachable
	})
	st, err := Read(ctx, viewer)
	if err != nil || len(st.Rollouts) != 1 || st.Rollouts[0].Permits[0].Unconfirmed {
		t.Fatalf("a mark written after the lease came back is shown unconfirmed: %+v %v", st, err)
	}
	p.Close() // nothing confirms it any more
	cl.StopAll()
	waitFor(t, "the lease lapses", func() bool { _, _, _, err := c.LeaseState(); return err != nil })
	cl.RestartAll()
	waitFor(t, "the mark unconfirmed", func() bool {
		st, err := Read(ctx, viewer)
		if err != nil || len(st.Rollouts) != 1 {
			return false
		}
		raw = st.Rollouts[0].Permits[0]
		return raw.Unconfirmed
	})
	if !strings.Contains(raw.String(), "unconfirmed since etcd returned") {
		t.Errorf("the permit reads %q", raw)
	}
}

// A host writes its own marks before it asks for anything: when Take returns, etcd has
// every mark this host made before it (the others count them), here a hundred members
// found down at once (the background writer needs a write for each).
func TestTakeWritesTheHostsMarksFirst(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	c, viewer := client(t, cl, "kpro5", false), client(t, cl, "viewer", true)
	p := NewPermits(c, nil)
	defer p.Close()
	for i := range 100 {
		p.Mark("qwen", fmt.Sprintf("server.down%d", i), "exited")
	}
	if err := p.Take(context.Background(), "qwen", "server.take", "restart", 1000); err != nil {
		t.Fatal(err)
	}
	if n := len(group(t, viewer).Permits); n != 101 {
		t.Fatalf("a permit was taken when etcd had %d of this host's 100 marks", n-1)
	}
}
