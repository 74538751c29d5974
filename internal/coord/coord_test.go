package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func open(t *testing.T, c *etcdtest.Cluster, host string, lease time.Duration) *Client {
	t.Helper()
	cfg := Config{Endpoints: c.Endpoints(), Prefix: "/agent/test", Lease: lease, Host: host}
	if c.TLS != nil {
		cfg.CAFile, cfg.CertFile, cfg.KeyFile = c.TLS.CA, c.TLS.Cert, c.TLS.Key
	}
	cl, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	waitLive(t, cl)
	return cl
}

func waitLive(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, _, _, err := c.LeaseState(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			_, _, _, err := c.LeaseState()
			t.Fatalf("%s: no lease after 30 s: %v", c.Host(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// Three hosts race for one permit many times: never two holders at once.
func TestSemaphoreNeverExceedsLimit(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) {
			cl := etcdtest.Start(t, n, etcdtest.Options{})
			var holding, most atomic.Int32
			var wg sync.WaitGroup
			for i := range 3 {
				c := open(t, cl, fmt.Sprintf("h%d", i), 5*time.Second)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for done := 0; done < 5; {
						_, err := c.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1)
						var ref *Refusal
						if errors.As(err, &ref) {
							time.Sleep(5 * time.Millisecond)
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						if h := holding.Add(1); h > most.Load() {
							most.Store(h)
						}
						time.Sleep(10 * time.Millisecond)
						holding.Add(-1)
						if err := c.Release(ctx(t), "qwen", "server.qwen"); err != nil {
							t.Error(err)
							return
						}
						done++
					}
				}()
			}
			wg.Wait()
			if m := most.Load(); m != 1 {
				t.Fatalf("at most %d permits held at once, want 1", m)
			}
		})
	}
}

// A killed holder's permit expires with its lease; until then the others are refused,
// and the refusal names the holder.
func TestKilledHoldersPermitExpiresWithItsLease(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro5", 2*time.Second)
	b := open(t, cl, "kpro6", 2*time.Second)
	if _, err := a.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1)
	var ref *Refusal
	if !errors.As(err, &ref) || len(ref.Holders) != 1 || ref.Holders[0].Host != "kpro5" {
		t.Fatalf("second permit: %v, want a refusal naming kpro5", err)
	}
	if want := "server.qwen on kpro5 (restart not verified yet)"; ref.Holders[0].String() != want {
		t.Errorf("holder %q, want %q", ref.Holders[0], want)
	}
	killed := time.Now()
	a.Abandon()
	for {
		_, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1)
		if err == nil {
			break
		}
		if !errors.As(err, &ref) {
			t.Fatal(err)
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatal("the killed holder's permit never expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := time.Since(killed); d < time.Second {
		t.Errorf("permit free %s after the kill: before its lease could expire", d)
	}
}

// etcd down longer than the lease: the agent takes nothing; when it returns, a new
// lease is granted and permits are taken again.
func TestNoPermitWithoutALiveLease(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro5", 2*time.Second)
	_, _, gen, _ := a.LeaseState()
	cl.StopAll()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, _, err := a.LeaseState(); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lease still live 20 s after etcd stopped")
		}
		time.Sleep(50 * time.Millisecond)
	}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := a.Acquire(c, "qwen", "server.qwen", "restart", 1); !errors.Is(err, ErrNoLease) {
		t.Fatalf("acquire without a lease: %v, want ErrNoLease", err)
	}
	if err := a.Hold(c, "qwen", "server.qwen", Down, "", "gone"); !errors.Is(err, ErrNoLease) {
		t.Fatalf("hold without a lease: %v, want ErrNoLease", err)
	}
	cl.RestartAll()
	waitLive(t, a)
	if _, err := a.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, g, _ := a.LeaseState(); g < gen {
		t.Fatalf("lease generation went back: %d < %d", g, gen)
	}
}

// A release deletes only the permit this client wrote: one recreated since (another
// revision) stays.
func TestReleaseIsFencedByRevision(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro5", 5*time.Second)
	rev, err := a.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1)
	if err != nil {
		t.Fatal(err)
	}
	key := a.permitKey("qwen", "server.qwen")
	raw := a.cli
	if _, err := raw.Delete(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	put, err := raw.Put(ctx(t), key, `{"state":"down","host":"kpro5","member":"server.qwen"}`)
	if err != nil {
		t.Fatal(err)
	}
	if put.Header.Revision == rev {
		t.Fatal("recreated with the same revision")
	}
	if err := a.Release(ctx(t), "qwen", "server.qwen"); err != nil {
		t.Fatal(err)
	}
	got, err := raw.Get(ctx(t), key)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the newer permit was released (%v)", err)
	}
}

// Members already down count: a host's down member holds a slot without asking.
func TestDownMembersCount(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro5", 5*time.Second)
	b := open(t, cl, "kpro6", 5*time.Second)
	if err := a.Hold(ctx(t), "qwen", "server.qwen", Down, "", "exited"); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1)
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Holders[0].State != Down || ref.Holders[0].Why != "exited" {
		t.Fatalf("acquire beside a down member: %v", err)
	}
	if _, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 2); err != nil {
		t.Fatalf("with two slots: %v", err)
	}
	if err := a.Release(ctx(t), "qwen", "server.qwen"); err != nil {
		t.Fatal(err)
	}
	gs, err := a.Rollouts(ctx(t))
	if err != nil || len(gs) != 1 || len(gs[0].Permits) != 1 || gs[0].Permits[0].Host != "kpro6" {
		t.Fatalf("rollouts %+v (%v), want kpro6's permit alone", gs, err)
	}
}

// A failed member stops the group fleet-wide until that member's host lifts it.
func TestFailStopsTheGroupUntilVerified(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro5", 5*time.Second)
	b := open(t, cl, "kpro6", 5*time.Second)
	if err := a.Fail(ctx(t), "qwen", "server.qwen", "exited with status 1: CUDA out of memory"); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 3)
	want := "rollout qwen stopped: server.qwen failed (host kpro5): exited with status 1: CUDA out of memory"
	if err == nil || err.Error() != want {
		t.Fatalf("acquire in a stopped group: %v, want %q", err, want)
	}
	if err := b.Unstop(ctx(t), "qwen", "server.qwen"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 3); err == nil {
		t.Fatal("another host lifted kpro5's stop")
	}
	if err := a.Unstop(ctx(t), "qwen", "server.qwen"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 3); err != nil {
		t.Fatal(err)
	}
}

// A host's entry goes with its lease; its last summary stays, not live.
func TestHostsShowLapsedHosts(t *testing.T) {
	cl := etcdtest.Start(t, 3, etcdtest.Options{TLS: true})
	a := open(t, cl, "kpro5", 2*time.Second)
	b := open(t, cl, "kpro6", 2*time.Second)
	for _, c := range []*Client{a, b} {
		if err := c.Publish(ctx(t), json.RawMessage(`{"host":"`+c.Host()+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
	cl.Stop(0) // one member of three down: the fleet goes on
	a.Abandon()
	deadline := time.Now().Add(20 * time.Second)
	for {
		hs, err := b.Hosts(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != 2 || !hs[1].Live || hs[1].Host != "kpro6" {
			t.Fatalf("hosts %+v", hs)
		}
		if !hs[0].Live {
			if string(hs[0].Summary) != `{"host":"kpro5"}` || hs[0].Updated.IsZero() {
				t.Fatalf("lapsed host %+v", hs[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("kpro5 still live 20 s after it died")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Without the client certificate the TLS cluster refuses: the configuration is used.
func TestTLSRequiresTheClientCertificate(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{TLS: true})
	c, err := Open(Config{Endpoints: cl.Endpoints(), Prefix: "/p", Lease: 2 * time.Second, Host: "x", CAFile: cl.TLS.CA})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := c.cli.Get(cctx, "/p", clientv3.WithPrefix()); err == nil {
		t.Fatal("a client without its certificate read the cluster")
	}
	if _, err := Open(Config{Endpoints: cl.Endpoints(), CAFile: "/nonexistent/ca.pem"}); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}

// An agent started again within its lease keeps it (the ID is in its state directory):
// what the dead process held keeps counting; past the lease it takes a new one.
func TestRestartKeepsTheLease(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	file := t.TempDir() + "/coordination-lease"
	cfg := Config{Endpoints: cl.Endpoints(), Prefix: "/agent/test", Lease: 2 * time.Second, Host: "kpro5", LeaseFile: file}
	first, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitLive(t, first)
	id, _, _, _ := first.LeaseState()
	if _, err := first.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1); err != nil {
		t.Fatal(err)
	}
	first.Abandon() // SIGKILL
	next, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitLive(t, next)
	if got, _, _, _ := next.LeaseState(); got != id {
		t.Fatalf("lease %x after a quick restart, want the previous process's %x", got, id)
	}
	time.Sleep(3 * time.Second) // past the TTL: kept alive, the permit is still there
	gs, err := next.Rollouts(ctx(t))
	if err != nil || len(gs) != 1 || len(gs[0].Permits) != 1 {
		t.Fatalf("the dead process's permit is gone after a restart within the lease: %+v %v", gs, err)
	}
	next.Abandon()
	time.Sleep(4 * time.Second) // dead longer than the lease
	last, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer last.Close()
	waitLive(t, last)
	if got, _, _, _ := last.LeaseState(); got == id {
		t.Fatal("an expired lease was kept")
	}
	if gs, _ := last.Rollouts(ctx(t)); len(gs) != 0 {
		t.Fatalf("the permit outlived its lease: %+v", gs)
	}
	if err := last.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("a revoked lease is still recorded: %v", err)
	}
}
