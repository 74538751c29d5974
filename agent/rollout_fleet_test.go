package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeEtcd is the fleet's permits as a PermitSource over etcd keeps them: one entry per
// host and member, a stop per group. Each host gets its own source over it.
type fakeEtcd struct {
	mu      sync.Mutex
	permits map[string]string // "host/addr" → why
	stop    string            // "addr@host: reason"
	down    bool              // etcd unreachable
	takes   []string
	kept    []string
	changed chan struct{}
}

func newFakeEtcd() *fakeEtcd {
	return &fakeEtcd{permits: map[string]string{}, changed: make(chan struct{})}
}

func (f *fakeEtcd) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

type fakeSource struct {
	f    *fakeEtcd
	host string
}

func (s *fakeSource) Take(ctx context.Context, group, addr, action string, slots int) error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.f.down {
		return errors.New("etcd: context deadline exceeded")
	}
	if s.f.stop != "" {
		cause, rest, _ := strings.Cut(s.f.stop, "@")
		host, reason, _ := strings.Cut(rest, ": ")
		return &FleetRefusal{Stopped: true, Cause: cause, Host: host, Reason: reason}
	}
	var holders []string
	for k, why := range s.f.permits {
		if k != s.host+"/"+addr {
			holders = append(holders, fmt.Sprintf("%s (%s)", k, why))
		}
	}
	if len(holders) >= slots {
		sort.Strings(holders)
		return &FleetRefusal{Holders: holders}
	}
	s.f.permits[s.host+"/"+addr] = action + " not verified yet"
	s.f.takes = append(s.f.takes, s.host+"/"+addr)
	s.f.notify()
	return nil
}

func (s *fakeSource) Mark(group, addr, why string) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.permits[s.host+"/"+addr] = why
	s.f.notify()
}

func (s *fakeSource) Fail(group, addr, reason string) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if s.f.stop == "" {
		s.f.stop = addr + "@" + s.host + ": " + reason
	}
	s.f.notify()
}

func (s *fakeSource) Release(addr string) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	delete(s.f.permits, s.host+"/"+addr)
	if strings.HasPrefix(s.f.stop, addr+"@"+s.host+":") {
		s.f.stop = ""
	}
	s.f.notify()
}

func (s *fakeSource) Keep(addrs []string) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.kept = addrs
}

func (s *fakeSource) Changed() <-chan struct{} {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return s.f.changed
}

// host is one host's engine over its own state directory, with one member of group qwen
// (member.<name>) and the fleet's permits.
func fleetHost(t *testing.T, f *fleet, etcd *fakeEtcd, name, value string) *Engine {
	t.Helper()
	dir := t.TempDir()
	e := fleetEngine(t, f, dir, fmt.Sprintf("member %q {\n  value = %q\n  rollout {\n    group = \"qwen\"\n  }\n}\n", name, value), Options{})
	r := NewRollouts(e.store)
	r.UseFleet(&fakeSource{f: etcd, host: "h-" + name})
	return fleetEngine(t, f, dir, fmt.Sprintf("member %q {\n  value = %q\n  rollout {\n    group = \"qwen\"\n  }\n}\n", name, value), Options{Rollouts: r})
}

// Three hosts apply at once: the fleet's permits let one member down at a time, and
// every permit is released once its member is verified.
func TestRolloutFleetOneAtATimeAcrossHosts(t *testing.T) {
	t.Parallel()
	f, etcd := newFleet(), newFakeEtcd()
	var engines []*Engine
	for _, m := range []string{"a", "b", "c"} {
		f.values["member."+m] = "v1"
		engines = append(engines, fleetHost(t, f, etcd, m, "v2"))
	}
	var wg sync.WaitGroup
	for _, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if rep := e.Apply(ctx, nil); rep.Failed() {
				t.Errorf("apply: %v", outcome(rep))
			}
		}()
	}
	wg.Wait()
	if f.peak != 1 {
		t.Errorf("%d members down at once across the hosts, want 1", f.peak)
	}
	if len(etcd.takes) != 3 || len(etcd.permits) != 0 {
		t.Errorf("permits taken %v, left %v: want three taken, none left", etcd.takes, etcd.permits)
	}
}

// A failure on one host stops the group on the others, naming the host; it is lifted
// when that member is verified again.
func TestRolloutFleetFailureStopsOtherHosts(t *testing.T) {
	t.Parallel()
	f, etcd := newFleet(), newFakeEtcd()
	f.values["member.a"], f.values["member.b"] = "v1", "v1"
	f.fail["member.a"] = true
	a, b := fleetHost(t, f, etcd, "a", "v2"), fleetHost(t, f, etcd, "b", "v2")
	ctx := context.Background()
	if rep := a.Apply(ctx, nil); !rep.Failed() {
		t.Fatal("the failing apply succeeded")
	}
	rep := b.Apply(ctx, nil)
	want := "rollout qwen stopped: member.a failed (host h-a): restart: not ready within 30ms; log: RuntimeError: CUDA out of memory (member.a)"
	if err := rep.Steps[0].Err; err == nil || err.Error() != want {
		t.Fatalf("the other host's apply: %v\nwant %s", err, want)
	}
	if _, ok := etcd.permits["h-a/member.a"]; !ok {
		t.Errorf("the failed member's permit is gone: %v", etcd.permits)
	}
	f.mu.Lock()
	f.fail["member.a"] = false
	f.mu.Unlock()
	if rep := a.Apply(ctx, nil); rep.Failed() {
		t.Fatalf("the repair: %v", outcome(rep))
	}
	if rep := b.Apply(ctx, nil); rep.Failed() {
		t.Fatalf("after the repair: %v", outcome(rep))
	}
	if etcd.stop != "" || len(etcd.permits) != 0 {
		t.Errorf("stop %q, permits %v left", etcd.stop, etcd.permits)
	}
}

// An apply waits for another host's member (it is not this apply's to finish) and goes
// on when it is released; the loop is told to wait, naming it.
func TestRolloutFleetWaitsForOtherHosts(t *testing.T) {
	t.Parallel()
	f, etcd := newFleet(), newFakeEtcd()
	f.values["member.a"] = "v1"
	etcd.permits["h-z/member.z"] = "restart not verified yet"
	a := fleetHost(t, f, etcd, "a", "v2")
	if err := a.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := a.Reconcile(context.Background(), "member.a")
	if !IsRolloutWait(st.Err) || !strings.Contains(st.Err.Error(), "h-z/member.z (restart not verified yet)") {
		t.Fatalf("the loop's reconcile: %v, want a wait naming the other host's member", st.Err)
	}
	done := make(chan *Report)
	go func() { done <- a.Apply(context.Background(), nil) }()
	select {
	case rep := <-done:
		t.Fatalf("the apply did not wait: %v", outcome(rep))
	case <-time.After(300 * time.Millisecond):
	}
	(&fakeSource{f: etcd, host: "h-z"}).Release("member.z")
	select {
	case rep := <-done:
		if rep.Failed() {
			t.Fatalf("after the release: %v", outcome(rep))
		}
	case <-time.After(time.Minute):
		t.Fatal("the apply never went on")
	}
}

// etcd unreachable: nothing healthy is disrupted (the loop waits, saying why), a member
// found down is still repaired and counted for the others.
func TestRolloutFleetWithoutEtcd(t *testing.T) {
	t.Parallel()
	f, etcd := newFleet(), newFakeEtcd()
	f.values["member.a"], f.values["member.b"] = "v1", "v2"
	f.down["member.b"] = true
	etcd.down = true
	a, b := fleetHost(t, f, etcd, "a", "v2"), fleetHost(t, f, etcd, "b", "v2")
	for _, e := range []*Engine{a, b} {
		if err := e.Prepare(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(etcd.kept) != "[member.b]" {
		t.Errorf("the fleet was told the plan's members %v, want [member.b]", etcd.kept)
	}
	st := a.Reconcile(context.Background(), "member.a")
	if !IsRolloutWait(st.Err) || !strings.Contains(st.Err.Error(), "nothing is disrupted until etcd answers") {
		t.Fatalf("healthy member without etcd: %v", st.Err)
	}
	if len(f.started) != 0 {
		t.Fatalf("disrupted without etcd: %v", f.started)
	}
	// The down member is a repair: it goes, and the others count it meanwhile.
	done := make(chan *Step)
	go func() { done <- b.Reconcile(context.Background(), "member.b") }()
	deadline := time.Now().Add(time.Minute)
	for {
		etcd.mu.Lock()
		why := etcd.permits["h-b/member.b"]
		etcd.mu.Unlock()
		if why != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the down member was never marked")
		}
		time.Sleep(time.Millisecond)
	}
	if st := <-done; st.Err != nil || !st.Applied {
		t.Fatalf("repair without etcd: %v", st.Err)
	}
	if _, ok := etcd.permits["h-b/member.b"]; ok {
		t.Errorf("the repaired member is still counted: %v", etcd.permits)
	}
}

// A member proven down (gone, unhealthy past its grace, wedged, its GPU faulted) is
// repaired at once while the fleet has no permit free: it asks etcd for none and is
// counted as down meanwhile. A healthy member of the same host waits, naming the holder.
func TestRolloutFleetRepairsDownMembersAtOnce(t *testing.T) {
	t.Parallel()
	for _, why := range []Reason{ReasonGone, ReasonUnhealthy, ReasonWedged, ReasonGPUFault} {
		t.Run(string(why), func(t *testing.T) {
			t.Parallel()
			f, etcd := newFleet(), newFakeEtcd()
			f.values["member.a"], f.values["member.b"] = "v2", "v1"
			f.down["member.a"], f.why["member.a"] = true, why
			etcd.permits["h-z/member.z"] = "restart not verified yet" // the group's one permit
			a, b := fleetHost(t, f, etcd, "a", "v2"), fleetHost(t, f, etcd, "b", "v2")
			for _, e := range []*Engine{a, b} {
				if err := e.Prepare(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if st := a.Reconcile(ctx, "member.a"); st.Err != nil || !st.Applied {
				t.Fatalf("the %s member's repair: applied %v, %v; want repaired at once", why, st.Applied, st.Err)
			}
			if slices.Contains(etcd.takes, "h-a/member.a") {
				t.Errorf("the repair asked etcd for a permit: %v", etcd.takes)
			}
			st := b.Reconcile(ctx, "member.b")
			if !IsRolloutWait(st.Err) || !strings.Contains(st.Err.Error(), "h-z/member.z (restart not verified yet)") {
				t.Fatalf("the healthy member's change: %v, want a wait naming the holder", st.Err)
			}
		})
	}
}
