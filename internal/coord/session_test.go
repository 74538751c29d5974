package coord

import (
	"errors"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord/etcdtest"
)

// waitGeneration waits until c's lease is live under a generation after gen (a new lease
// or a new epoch) and returns it.
func waitGeneration(t *testing.T, c *Client, gen int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, g, err := c.LeaseState()
		if err == nil && g > gen {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no live lease after generation %d in 30 s (now %d: %v)", c.Host(), gen, g, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// etcd back without its data (a member on a tmpfs, a restore): the first agent to reach
// it finds its lease gone early and the revision lower, and fences the fleet for one
// lease before it takes a new lease: no permit is granted to anyone meanwhile, so every
// host has a full lease to write what it has down or in flight again.
func TestEtcdLostItsStateFencesNewPermits(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a, b := open(t, cl, "kpro5", 2*time.Second), open(t, cl, "kpro6", 2*time.Second)
	if err := a.Hold(ctx(t), "qwen", "server.qwen", Down, "", "exited"); err != nil {
		t.Fatal(err)
	}
	if err := a.Publish(ctx(t), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // a renewal or two: both have seen the revision
	_, _, genA, _ := a.LeaseState()
	_, _, genB, _ := b.LeaseState()
	cl.RestartAllEmpty()
	back := time.Now()
	waitGeneration(t, a, genA)
	waitGeneration(t, b, genB)

	e, err := b.Fence(ctx(t))
	if err != nil || e == nil {
		t.Fatalf("no epoch fence in etcd after it lost its state: %v %v", e, err)
	}
	t.Logf("fence: %s", e.Error())
	var refused *Epoch
	granted := time.Time{}
	for time.Since(back) < 20*time.Second {
		_, err := b.Acquire(ctx(t), "qwen", "server.other", "restart", 1)
		if err == nil {
			granted = time.Now()
			break
		}
		if !errors.As(err, &refused) {
			t.Fatalf("refused for another reason than the epoch: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if refused == nil {
		t.Fatal("a permit was granted at once in the new epoch: the others had no lease to write their marks again")
	}
	if granted.IsZero() {
		t.Fatal("the fence never lifted (20 s)")
	}
	// The fence lives one lease (2 s) from its grant, which came after etcd answered.
	if d := granted.Sub(e.Since); d < 2*time.Second-100*time.Millisecond {
		t.Errorf("a permit was granted %s after the fence: before a full lease", d)
	}
	t.Logf("refused (%s) until %s after etcd answered", refused.Reason, granted.Sub(back).Round(time.Millisecond))
}

// etcd stopped for 10 s and started again with its data: the agent reconnects within a
// second or so (backoff capped at ReconnectMax, renewal at once when the connection is
// ready) and keeps its lease, which etcd restored in full, rather than reaching etcd after
// the lease expired there (gRPC's default backoff had grown to ~6 s by then).
func TestLeaseKeptAcrossAnEtcdRestart(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	c := open(t, cl, "kpro5", 3*time.Second)
	id, _, gen, _ := c.LeaseState()
	cl.StopAll()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, _, _, err := c.LeaseState(); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease stayed live 10 s without etcd")
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(deadline))
	cl.RestartAll()
	back := time.Now()
	for {
		got, _, g, err := c.LeaseState()
		if err == nil {
			if got != id || g != gen {
				t.Fatalf("lease %x (generation %d) after etcd's restart with its data, want %x (%d) kept", got, g, id, gen)
			}
			break
		}
		if time.Since(back) > 10*time.Second {
			t.Fatalf("no live lease 10 s after etcd answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	d := time.Since(back)
	t.Logf("lease %x live again %s after etcd answered", id, d.Round(time.Millisecond))
	if d > 2*time.Second {
		t.Errorf("the lease was live again %s after etcd answered; want within 2 s", d)
	}
}
