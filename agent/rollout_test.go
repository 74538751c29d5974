package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// fleet is a fake group of servers: each member serves a value, a restart takes it down
// for the length of its Apply, and the fleet tracks how many are down at every moment.
type fleet struct {
	mu      sync.Mutex
	values  map[string]string
	down    map[string]bool
	fail    map[string]bool   // Apply fails, leaving the member down
	why     map[string]Reason // why a down member is down (ReasonGone when unset)
	done    map[string]bool   // Apply returned (for wait resources)
	started []string          // members in the order their Apply started
	peak    int
	changed chan struct{}
}

func newFleet() *fleet {
	return &fleet{values: map[string]string{}, down: map[string]bool{}, fail: map[string]bool{}, why: map[string]Reason{}, done: map[string]bool{}, changed: make(chan struct{})}
}

// unavailable counts the members down (under f.mu) and keeps the peak.
func (f *fleet) note() {
	n := 0
	for _, d := range f.down {
		if d {
			n++
		}
	}
	f.peak = max(f.peak, n)
	close(f.changed)
	f.changed = make(chan struct{})
}

type memberConfig struct {
	Value string `hcl:"value"`
}

type member struct {
	f    *fleet
	addr string
	cfg  *memberConfig
}

func (m *member) Check(ctx context.Context, env *Env) (*Diff, error) {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	v, ok := m.f.values[m.addr]
	switch {
	case !ok:
		return (&Diff{}).Add(Added("value", m.cfg.Value).Because(Creates, ReasonMissing)), nil
	case m.f.down[m.addr]:
		why := m.f.why[m.addr]
		if why == "" {
			why = ReasonGone
		}
		return (&Diff{}).Add(Set("process", Raw(string(why)), Raw("a new generation")).Because(Restarts, why)), nil
	case v != m.cfg.Value:
		return (&Diff{}).Add(Set("value", v, m.cfg.Value).Because(Restarts, ReasonIdentity)), nil
	}
	return NoChange(), nil
}

func (m *member) Apply(ctx context.Context, env *Env, d *Diff) error {
	m.f.mu.Lock()
	m.f.started = append(m.f.started, m.addr)
	m.f.down[m.addr] = true
	m.f.note()
	m.f.mu.Unlock()
	select { // long enough for a second disruption to overlap if the engine allowed one
	case <-time.After(30 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	defer m.f.note()
	m.f.done[m.addr] = true
	if m.f.fail[m.addr] {
		return fmt.Errorf("not ready within 30ms; log: RuntimeError: CUDA out of memory (%s)", m.addr)
	}
	m.f.values[m.addr], m.f.down[m.addr] = m.cfg.Value, false
	return nil
}

func (m *member) Status(ctx context.Context, env *Env) (*Status, error) {
	return &Status{Healthy: true, Summary: "serving", Fields: []Field{TextField(MemberField, "member", "m-"+strings.TrimPrefix(m.addr, "member."))}}, nil
}

// waitConfig is a resource whose Apply waits until a member's Apply returned: members
// that depend on one are admitted in a known order.
type waitConfig struct {
	After string `hcl:"after"`
}

type waiter struct {
	f   *fleet
	cfg *waitConfig
}

func (w *waiter) Check(ctx context.Context, env *Env) (*Diff, error) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	if w.f.done[env.Addr] {
		return NoChange(), nil
	}
	return (&Diff{}).Add(Set("after", "", w.cfg.After)), nil
}

func (w *waiter) Apply(ctx context.Context, env *Env, d *Diff) error {
	for {
		w.f.mu.Lock()
		ok, ch := w.f.done[w.cfg.After], w.f.changed
		if ok {
			w.f.done[env.Addr] = true
			w.f.mu.Unlock()
			return nil
		}
		w.f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func fleetKinds(f *fleet) []Kind {
	return []Kind{
		NewKind("member", func(r *plans.Resource, c *memberConfig) (Resource, hcl.Diagnostics) {
			return &member{f: f, addr: r.Addr, cfg: c}, nil
		}),
		NewKind("wait", func(r *plans.Resource, c *waitConfig) (Resource, hcl.Diagnostics) {
			return &waiter{f: f, cfg: c}, nil
		}),
	}
}

func fleetEngine(t *testing.T, f *fleet, dir, src string, opts Options) *Engine {
	t.Helper()
	k := fleetKinds(f)
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(src)}}, plans.Options{Schemas: Schemas(k)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	store, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(p, k, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// group writes n members of group qwen serving value, with max_unavailable maxU; extra
// is appended to member i's body when set.
func group(n, maxU int, value string, extra map[int]string) string {
	var b strings.Builder
	for i := range n {
		name := string(rune('a' + i))
		fmt.Fprintf(&b, "member %q {\n  value = %q\n  rollout {\n    group           = \"qwen\"\n    max_unavailable = %d\n  }\n%s}\n", name, value, maxU, extra[i])
	}
	return b.String()
}

func TestRollout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		plan  string
		setup func(f *fleet, dir string)
		opts  Options
		// want is each resource's outcome (outcome()); peak the most members down at once.
		want map[string]string
		peak int
		// first, when set, is the member whose Apply must start first; order, the order
		// of them all.
		first string
		order []string
		// errs are substrings of each resource's error.
		errs map[string]string
		// inFlight are the members left recorded in rollouts.json.
		inFlight []string
	}{
		{
			name:  "three members, one at a time, in the plan's order",
			plan:  group(3, 1, "v2", nil),
			want:  map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart"},
			peak:  1,
			order: []string{"member.a", "member.b", "member.c"},
		},
		{
			name:  "a member declared first that depends on a later one goes after it",
			plan:  group(3, 1, "v2", map[int]string{0: "  depends_on = [member.c]\n"}),
			want:  map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart"},
			peak:  1,
			order: []string{"member.b", "member.c", "member.a"},
		},
		{
			name: "four members, two at a time",
			plan: group(4, 2, "v2", nil),
			want: map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart", "member.d": "applied:restart"},
			peak: 2,
		},
		{
			name: "parallelism 1 with waiters does not starve the walk",
			plan: group(3, 1, "v2", nil),
			opts: Options{Parallelism: 1},
			want: map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart"},
			peak: 1,
		},
		{
			name: "the second fails: the third is not started",
			plan: group(3, 1, "v2", map[int]string{1: "  depends_on = [wait.b]\n", 2: "  depends_on = [wait.c]\n"}) +
				`wait "b" { after = "member.a" }
wait "c" { after = "member.b" }
`,
			setup: func(f *fleet, dir string) { f.fail["member.b"] = true },
			want: map[string]string{"member.a": "applied:restart", "member.b": "error", "member.c": "skipped:member.b",
				"wait.b": "applied:update", "wait.c": "applied:update"},
			peak:     1,
			first:    "member.a",
			errs:     map[string]string{"member.c": "rollout qwen stopped: member.b failed (member m-b): restart: not ready within 30ms; log: RuntimeError: CUDA out of memory (member.b)"},
			inFlight: []string{"member.b"},
		},
		{
			name: "a member already down is repaired first and counts as unavailable",
			plan: group(3, 1, "v2", nil),
			setup: func(f *fleet, dir string) {
				f.values["member.a"], f.down["member.a"] = "v2", true
			},
			want:  map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart"},
			peak:  1,
			first: "member.a",
		},
		{
			name: "a member down whose repair fails holds the others",
			plan: group(3, 1, "v2", nil),
			setup: func(f *fleet, dir string) {
				f.values["member.a"], f.down["member.a"] = "v2", true
				f.fail["member.a"] = true
			},
			want:     map[string]string{"member.a": "error", "member.b": "skipped:member.a", "member.c": "skipped:member.a"},
			peak:     1,
			first:    "member.a",
			errs:     map[string]string{"member.b": "rollout qwen stopped: member.a failed (member m-a)"},
			inFlight: []string{"member.a"},
		},
		{
			name: "a member down outside --target holds the target",
			plan: group(3, 1, "v2", nil),
			setup: func(f *fleet, dir string) {
				f.values["member.a"], f.down["member.a"] = "v2", true
			},
			opts: Options{Targets: []string{"member.b"}},
			want: map[string]string{"member.b": "skipped:member.a"},
			errs: map[string]string{"member.b": "rollout qwen: not started: max_unavailable = 1 and 1 member is unavailable: member.a (gone)"},
		},
		{
			name: "a down member does not hold a group with room",
			plan: group(3, 2, "v2", nil),
			setup: func(f *fleet, dir string) {
				f.values["member.a"], f.down["member.a"] = "v2", true
			},
			want: map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart"},
			peak: 2,
		},
		{
			name: "resumed after a SIGKILL: the member in flight finishes first",
			plan: group(3, 1, "v2", nil),
			setup: func(f *fleet, dir string) {
				// The killed apply had stopped member.c's old generation and recorded it;
				// member.c is on the new value but not yet verified ready.
				f.values["member.c"] = "v2"
				f.down["member.c"] = true
				st, err := state.Open(dir)
				if err != nil {
					panic(err)
				}
				if err := st.SaveRollouts(map[string]state.RolloutMember{"member.c": {Group: "qwen", Action: "restart", Since: time.Now()}}); err != nil {
					panic(err)
				}
			},
			want:  map[string]string{"member.a": "applied:restart", "member.b": "applied:restart", "member.c": "applied:restart"},
			peak:  1,
			first: "member.c",
		},
		{
			name: "a resource outside the group is not held",
			plan: group(2, 1, "v1", nil) + "member \"x\" {\n  value = \"v1\"\n}\n",
			setup: func(f *fleet, dir string) {
				f.values["member.a"], f.down["member.a"] = "v1", true
				f.fail["member.a"] = true
			},
			want:     map[string]string{"member.a": "error", "member.b": "no-op", "member.x": "applied:create"},
			errs:     map[string]string{"member.a": "CUDA out of memory"},
			peak:     2, // member.x is created while member.a is repaired: it is in no group
			inFlight: []string{"member.a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet()
			for _, m := range []string{"member.a", "member.b", "member.c", "member.d"} {
				f.values[m] = "v1"
			}
			dir := t.TempDir()
			if tc.setup != nil {
				tc.setup(f, dir)
			}
			f.peak = 0
			e := fleetEngine(t, f, dir, tc.plan, tc.opts)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rep := e.Apply(ctx, nil)
			got := outcome(rep)
			for addr, want := range tc.want {
				if got[addr] != want {
					t.Errorf("%s: %s, want %s (err %v)", addr, got[addr], want, stepErr(rep, addr))
				}
			}
			for addr, want := range tc.errs {
				if err := stepErr(rep, addr); err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: error %v, want it to contain %q", addr, err, want)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.peak != tc.peak {
				t.Errorf("at most %d members were down at once, want %d (applies started in order %v)", f.peak, tc.peak, f.started)
			}
			if tc.order != nil && !slices.Equal(f.started, tc.order) {
				t.Errorf("applies started in order %v, want %v", f.started, tc.order)
			}
			if tc.first != "" && (len(f.started) == 0 || f.started[0] != tc.first) {
				t.Errorf("applies started in order %v, want %s first", f.started, tc.first)
			}
			for addr, want := range tc.want {
				if strings.HasPrefix(want, "skipped") && (slices.Contains(f.started, addr) || f.values[addr] != "v1" || f.down[addr]) {
					t.Errorf("%s was skipped but touched: started %v, value %q, down %v", addr, f.started, f.values[addr], f.down[addr])
				}
			}
			m, err := e.store.LoadRollouts()
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for a := range m {
				left = append(left, a)
			}
			slices.Sort(left)
			if strings.Join(left, ",") != strings.Join(tc.inFlight, ",") {
				t.Errorf("left in flight: %v, want %v", left, tc.inFlight)
			}
		})
	}
}

func stepErr(rep *Report, addr string) error {
	for _, st := range rep.Steps {
		if st.Addr == addr {
			return st.Err
		}
	}
	return errors.New("no step")
}

// TestRolloutResumesAFailedRollout: the next apply retries the failed member first and,
// once it is verified, goes on with the rest.
func TestRolloutResumesAFailedRollout(t *testing.T) {
	t.Parallel()
	f := newFleet()
	for _, m := range []string{"member.a", "member.b", "member.c"} {
		f.values[m] = "v1"
	}
	f.fail["member.b"] = true
	dir := t.TempDir()
	plan := group(3, 1, "v2", nil)
	ctx := context.Background()
	rep := fleetEngine(t, f, dir, plan, Options{}).Apply(ctx, nil)
	if !rep.Failed() {
		t.Fatal("the first apply did not fail")
	}
	f.mu.Lock()
	f.fail["member.b"] = false
	firstRun := len(f.started)
	f.peak = 0
	f.mu.Unlock()
	rep = fleetEngine(t, f, dir, plan, Options{}).Apply(ctx, nil)
	if rep.Failed() {
		t.Fatalf("the second apply failed: %v", outcome(rep))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started[firstRun] != "member.b" || f.peak != 1 {
		t.Errorf("second apply started %v (peak %d), want member.b first, one at a time", f.started[firstRun:], f.peak)
	}
	if _, err := os.Stat(filepath.Join(dir, "rollouts.json")); !os.IsNotExist(err) {
		t.Errorf("rollouts.json is still there after a verified rollout: %v", err)
	}
}

// TestRolloutReconcileNeverWaits: the reconcile loop's per-resource path gets a Waiting
// error instead of blocking a worker, and goes on once the member in flight verified.
func TestRolloutReconcileNeverWaits(t *testing.T) {
	t.Parallel()
	f := newFleet()
	for _, m := range []string{"member.a", "member.b"} {
		f.values[m] = "v1"
	}
	dir := t.TempDir()
	e := fleetEngine(t, f, dir, group(2, 1, "v2", nil), Options{})
	if err := e.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// member.b has not been observed by this process: it may be down, so member.a waits.
	st := e.Reconcile(ctx, "member.a")
	if !IsRolloutWait(st.Err) || !strings.Contains(st.Err.Error(), "member.b (not observed yet)") {
		t.Fatalf("first reconcile: %v, want a rollout wait on member.b", st.Err)
	}
	// Mid-disruption of member.b, member.a waits without blocking.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if st := e.Reconcile(ctx, "member.b"); st.Err != nil || !st.Applied {
			t.Errorf("member.b: %v", st.Err)
		}
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		f.mu.Lock()
		down := f.down["member.b"]
		f.mu.Unlock()
		if down || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	st = e.Reconcile(ctx, "member.a")
	if !IsRolloutWait(st.Err) || !strings.Contains(st.Err.Error(), "rollout qwen: waiting") || st.Applied {
		t.Fatalf("during member.b's restart: %v, want a rollout wait", st.Err)
	}
	if _, ok := st.Skipped(); !ok {
		t.Error("a rollout wait is not reported as skipped")
	}
	wg.Wait()
	st = e.Reconcile(ctx, "member.a")
	if st.Err != nil || !st.Applied {
		t.Fatalf("after member.b verified: %v", st.Err)
	}
	if f.peak != 1 {
		t.Errorf("peak %d, want 1", f.peak)
	}
}

// TestRolloutPlanLine: the plan shows each group's disruptions and its limit.
func TestRolloutPlanLine(t *testing.T) {
	t.Parallel()
	f := newFleet()
	for _, m := range []string{"member.a", "member.b", "member.c"} {
		f.values[m] = "v1"
	}
	f.down["member.c"] = true
	e := fleetEngine(t, f, t.TempDir(), group(3, 1, "v2", nil), Options{})
	rep := e.Plan(context.Background())
	// The views print the summaries as they are (internal/view: the line, --json's rollouts).
	if len(rep.Rollouts) != 1 || rep.Rollouts[0].Disruptions.Restart != 2 || rep.Rollouts[0].MaxUnavailable != 1 {
		t.Fatalf("rollouts: %+v", rep.Rollouts)
	}
	want := "rollout qwen: 2 restarts, 1 at a time; member.c down (repaired first, counted as unavailable)"
	if got := rep.Rollouts[0].String(); got != want {
		t.Errorf("plan line %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(e.store.Dir(), "rollouts.json")); !os.IsNotExist(err) {
		t.Errorf("plan wrote rollouts.json: %v", err)
	}
}

// TestRolloutCorruptRecordStopsApply: a rollouts.json that cannot be read is an error
// before anything acts, never a guess that nothing is in flight.
func TestRolloutCorruptRecordStopsApply(t *testing.T) {
	t.Parallel()
	f := newFleet()
	for _, m := range []string{"member.a", "member.b"} {
		f.values[m] = "v1"
	}
	dir := t.TempDir()
	e := fleetEngine(t, f, dir, group(2, 1, "v2", nil), Options{})
	if err := os.WriteFile(filepath.Join(dir, "rollouts.json"), []byte(`{"member.a": `), 0o600); err != nil {
		t.Fatal(err)
	}
	rep := e.Apply(context.Background(), nil)
	for _, st := range rep.Steps {
		if st.Err == nil || !strings.Contains(st.Err.Error(), "rollouts.json is corrupt") {
			t.Errorf("%s: %v, want the corrupt record named", st.Addr, st.Err)
		}
	}
	if len(f.started) != 0 {
		t.Errorf("acted with a corrupt record: %v", f.started)
	}
}

// TestUnavailableCountsRepairs: a member found down (missing, gone, unhealthy past its
// grace, wedged, or hit by a GPU fault) is unavailable, so its repair is never held back
// by its group's limit; a planned change of a serving member is a disruption.
func TestUnavailableCountsRepairs(t *testing.T) {
	for _, tc := range []struct {
		reason Reason
		down   bool
	}{
		{ReasonMissing, true}, {ReasonGone, true}, {ReasonUnhealthy, true},
		{ReasonWedged, true}, {ReasonGPUFault, true},
		{ReasonDiffers, false}, {ReasonUnverified, false},
	} {
		d := &Diff{}
		d.Add(Set("process", "a", "b").Because(Restarts, tc.reason))
		if why, down := d.Unavailable(); down != tc.down {
			t.Errorf("%s: down = %v (%q), want %v", tc.reason, down, why, tc.down)
		}
	}
}
