package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/dag"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// host is a fake host: a map of values that fake resources observe and set.
type host struct {
	mu      sync.Mutex
	values  map[string]string
	applies map[string]int
	active  atomic.Int32
	peak    atomic.Int32
}

func newHost() *host { return &host{values: map[string]string{}, applies: map[string]int{}} }

type fakeConfig struct {
	Value     string  `hcl:"value"`
	Fail      *bool   `hcl:"fail,optional"`
	Panic     *bool   `hcl:"panic,optional"`
	Sleep     *string `hcl:"sleep,optional"`
	Stubborn  *bool   `hcl:"stubborn,optional"` // Apply "succeeds" but changes nothing
	Restart   *bool   `hcl:"restart,optional"`  // changes are restarts
	CheckFail *bool   `hcl:"check_fail,optional"`
	// InnerDeadline: Apply waits on a deadline of its own this long (a probe's, an HTTP
	// client's), far inside the step's timeout, and returns its error.
	InnerDeadline *string `hcl:"inner_deadline,optional"`
}

type fake struct {
	h    *host
	addr string
	cfg  *fakeConfig
}

func (f *fake) Check(ctx context.Context, env *Env) (*Diff, error) {
	if f.cfg.CheckFail != nil && *f.cfg.CheckFail {
		return nil, errors.New("cannot observe")
	}
	f.h.mu.Lock()
	have, ok := f.h.values[f.addr]
	f.h.mu.Unlock()
	switch {
	case !ok:
		return (&Diff{Action: Create}).Add(Added("value", f.cfg.Value)), nil
	case have != f.cfg.Value:
		a := Update
		if f.cfg.Restart != nil && *f.cfg.Restart {
			a = Restart
		}
		return (&Diff{Action: a}).Add(Set("value", have, f.cfg.Value)), nil
	}
	return NoChange(), nil
}

func (f *fake) Apply(ctx context.Context, env *Env, d *Diff) error {
	c := f.h.active.Add(1)
	defer f.h.active.Add(-1)
	for {
		p := f.h.peak.Load()
		if c <= p || f.h.peak.CompareAndSwap(p, c) {
			break
		}
	}
	if f.cfg.Panic != nil && *f.cfg.Panic {
		panic("boom")
	}
	if f.cfg.InnerDeadline != nil {
		dur, _ := time.ParseDuration(*f.cfg.InnerDeadline)
		inner, cancel := context.WithTimeout(ctx, dur)
		defer cancel()
		<-inner.Done()
		return fmt.Errorf("GET http://m2/1.0/instances/c: %w", inner.Err())
	}
	if f.cfg.Sleep != nil {
		dur, _ := time.ParseDuration(*f.cfg.Sleep)
		select {
		case <-time.After(dur):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if f.cfg.Fail != nil && *f.cfg.Fail {
		return errors.New("apply failed on purpose")
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	f.h.applies[f.addr]++
	if f.cfg.Stubborn == nil || !*f.cfg.Stubborn {
		f.h.values[f.addr] = f.cfg.Value
	}
	return nil
}

type timeoutFake struct{ *fake }

func (t timeoutFake) Timeout() time.Duration { return 50 * time.Millisecond }

func kinds(h *host) []Kind {
	return []Kind{NewKind("fake", func(r *plans.Resource, c *fakeConfig) (Resource, hcl.Diagnostics) {
		f := &fake{h: h, addr: r.Addr, cfg: c}
		if strings.HasPrefix(r.Name, "short_timeout") {
			return timeoutFake{f}, nil
		}
		return f, nil
	})}
}

func engine(t *testing.T, h *host, src string, opts Options) *Engine {
	t.Helper()
	k := kinds(h)
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(src)}}, plans.Options{Schemas: Schemas(k)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(p, k, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func outcome(rep *Report) map[string]string {
	out := map[string]string{}
	for _, st := range rep.Steps {
		switch {
		case st.Err != nil:
			if cause, ok := st.Skipped(); ok {
				out[st.Addr] = "skipped:" + cause
			} else {
				out[st.Addr] = "error"
			}
		case st.Applied:
			out[st.Addr] = "applied:" + string(st.Diff.Action)
		default:
			out[st.Addr] = string(st.Diff.Action)
		}
	}
	return out
}

const chain = `
fake "a" { value = "1" }
fake "b" {
  value = "${fake.a.value}-2"
}
fake "c" {
  value      = "3"
  depends_on = [fake.b]
}
fake "d" { value = "4" }
`

func TestPlanThenApplyThenNoChanges(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, chain, Options{})
	rep := e.Plan(context.Background())
	if diff := cmp.Diff(map[string]string{"fake.a": "create", "fake.b": "create", "fake.c": "create", "fake.d": "create"}, outcome(rep)); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
	if len(h.applies) != 0 {
		t.Fatalf("plan applied something: %v", h.applies)
	}
	var order []string
	rep = e.Apply(context.Background(), func(ev Event) {
		if ev.Phase == "done" {
			order = append(order, ev.Step.Addr)
		}
	})
	if rep.Failed() {
		t.Fatalf("apply failed: %v", outcome(rep))
	}
	pos := map[string]int{}
	for i, a := range order {
		pos[a] = i
	}
	if !(pos["fake.a"] < pos["fake.b"] && pos["fake.b"] < pos["fake.c"]) {
		t.Errorf("apply order %v breaks a → b → c", order)
	}
	if h.values["fake.b"] != "1-2" {
		t.Errorf("fake.b = %q, want the reference resolved", h.values["fake.b"])
	}
	// Converged: plan says no changes and apply touches nothing.
	if rep := e.Plan(context.Background()); rep.Changes() || rep.Failed() {
		t.Errorf("second plan = %v, want no changes", outcome(rep))
	}
	before := fmt.Sprint(h.applies)
	e.Apply(context.Background(), nil)
	if after := fmt.Sprint(h.applies); after != before {
		t.Errorf("apply of a converged plan applied: %s → %s", before, after)
	}
}

func TestApplyFailureSkipsDependentsOnly(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, `
fake "a" {
  value = "1"
  fail  = true
}
fake "b" { value = fake.a.value }
fake "c" {
  value      = "3"
  depends_on = [fake.b]
}
fake "d" { value = "4" }
`, Options{})
	rep := e.Apply(context.Background(), nil)
	want := map[string]string{"fake.a": "error", "fake.b": "skipped:fake.a", "fake.c": "skipped:fake.a", "fake.d": "applied:create"}
	if diff := cmp.Diff(want, outcome(rep)); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	for _, st := range rep.Steps {
		if st.Addr == "fake.a" && !strings.HasPrefix(st.Err.Error(), "fake.a: create: apply failed on purpose") {
			t.Errorf("error = %q, want it prefixed with the address and action", st.Err)
		}
	}
}

func TestApplyPanicBecomesError(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, "fake \"p\" {\n  value = \"x\"\n  panic = true\n}\nfake \"q\" { value = \"y\" }\n", Options{})
	rep := e.Apply(context.Background(), nil)
	if got := outcome(rep); got["fake.p"] != "error" || got["fake.q"] != "applied:create" {
		t.Fatalf("outcome = %v", got)
	}
	if err := rep.Steps[0].Err; !strings.Contains(err.Error(), "panic: boom") {
		t.Errorf("error = %v", err)
	}
}

func TestStepTimeout(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, "fake \"short_timeout\" {\n  value = \"x\"\n  sleep = \"10s\"\n}\n", Options{})
	rep := e.Apply(context.Background(), nil)
	err := rep.Steps[0].Err
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "50ms") {
		t.Fatalf("error = %v, want a deadline error naming the 50ms timeout", err)
	}
}

// Issue 27, point 7: a deadline inside a step (an HTTP client's, a probe's) that expires
// long before the step's own timeout is not labelled with the step's whole limit ("did
// not finish within 4m18s", 20 s in): the error says a deadline within the step expired,
// after how long, and what the step's own limit is.
func TestAnInnerDeadlineIsNotTheStepTimeout(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, "fake \"a\" {\n  value = \"x\"\n  inner_deadline = \"50ms\"\n}\n", Options{StepTimeout: time.Hour})
	err := e.Apply(context.Background(), nil).Steps[0].Err
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want the inner deadline's", err)
	}
	msg := err.Error()
	if strings.Contains(msg, "did not finish within 1h") || !strings.Contains(msg, "a deadline within the step expired after") ||
		!strings.Contains(msg, "the step's own timeout, 1h0m0s, had not passed") {
		t.Errorf("error = %q", msg)
	}
}

func TestApplyVerifiesConvergence(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, "fake \"s\" {\n  value = \"x\"\n  stubborn = true\n}\n", Options{})
	rep := e.Apply(context.Background(), nil)
	if err := rep.Steps[0].Err; !errors.Is(err, ErrNotConverged) {
		t.Fatalf("error = %v, want ErrNotConverged", err)
	}
	if rep.Steps[0].Applied {
		t.Error("a step that did not converge is marked applied")
	}
}

func TestParallelism(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			h := newHost()
			var src strings.Builder
			for i := range 8 {
				fmt.Fprintf(&src, "fake \"r%d\" {\n  value = \"v\"\n  sleep = \"30ms\"\n}\n", i)
			}
			e := engine(t, h, src.String(), Options{Parallelism: n})
			if rep := e.Apply(context.Background(), nil); rep.Failed() {
				t.Fatal(outcome(rep))
			}
			if got := h.peak.Load(); got > int32(n) || (n > 1 && got < 2) {
				t.Errorf("peak concurrent applies = %d with --parallelism %d", got, n)
			}
		})
	}
}

func TestTargetActsOnClosureOnly(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, chain, Options{Targets: []string{"fake.b"}})
	rep := e.Apply(context.Background(), nil)
	if diff := cmp.Diff(map[string]string{"fake.a": "applied:create", "fake.b": "applied:create"}, outcome(rep)); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
	if _, ok := h.values["fake.d"]; ok {
		t.Error("a resource outside the target was applied")
	}
}

func TestHostGuard(t *testing.T) {
	t.Parallel()
	h := newHost()
	k := kinds(h)
	src := "host {\n  hostname = \"kpro5\"\n}\nfake \"a\" { value = \"1\" }\n"
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(src)}}, plans.Options{Schemas: Schemas(k)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	store, _ := state.Open(t.TempDir())
	tests := []struct {
		name, hostname, override string
		ok                       bool
	}{
		{"same host", "kpro5", "", true},
		{"other host", "kpro6", "", false},
		{"override names the plan's host", "kpro6", "kpro5", true},
		{"override names another host", "kpro6", "kpro6", false},
	}
	for _, tt := range tests {
		_, err := New(p, k, store, Options{Hostname: tt.hostname, HostOverride: tt.override})
		if (err == nil) != tt.ok {
			t.Errorf("%s: New = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && (!errors.Is(err, ErrWrongHost) || !strings.Contains(err.Error(), "--host-override kpro5")) {
			t.Errorf("%s: error %q does not say how to override", tt.name, err)
		}
	}
}

func TestNoDestructive(t *testing.T) {
	t.Parallel()
	h := newHost()
	h.values["fake.r"] = "old"
	e := engine(t, h, "fake \"r\" {\n  value = \"new\"\n  restart = true\n}\nfake \"c\" { value = \"x\" }\n", Options{NoDestructive: true})
	rep := e.Apply(context.Background(), nil)
	if got := outcome(rep); got["fake.r"] != "error" || got["fake.c"] != "applied:create" {
		t.Fatalf("outcome = %v", got)
	}
	if !errors.Is(rep.Steps[0].Err, ErrDestructiveRefused) || h.values["fake.r"] != "old" {
		t.Errorf("err = %v, value = %q", rep.Steps[0].Err, h.values["fake.r"])
	}
}

func TestStatusDerivedFromCheck(t *testing.T) {
	t.Parallel()
	h := newHost()
	h.values["fake.a"] = "1"
	e := engine(t, h, "fake \"a\" { value = \"1\" }\nfake \"b\" { value = \"2\" }\nfake \"c\" {\n  value = \"3\"\n  check_fail = true\n}\n", Options{})
	rep := e.Status(context.Background())
	if !rep.Degraded() {
		t.Error("status with drift and an error is not degraded")
	}
	if s := rep.Steps[0].Status; s == nil || !s.Healthy {
		t.Errorf("fake.a status = %+v, want healthy", s)
	}
	if s := rep.Steps[1].Status; s == nil || s.Healthy || !strings.Contains(s.Summary, "create") {
		t.Errorf("fake.b status = %+v, want drift", s)
	}
	if rep.Steps[2].Err == nil {
		t.Error("fake.c: want the observation error")
	}
}

func TestCancelledApplyDoesNotStartMore(t *testing.T) {
	t.Parallel()
	h := newHost()
	e := engine(t, h, chain, Options{Parallelism: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep := e.Apply(ctx, nil)
	for _, st := range rep.Steps {
		if st.Applied {
			t.Errorf("%s was applied after cancellation", st.Addr)
		}
		if !errors.Is(st.Err, dag.ErrNotRun) && st.Err == nil {
			t.Errorf("%s: err = %v", st.Addr, st.Err)
		}
	}
}

// Hold is asked again right before the action: a reconcile loop that began to stop
// while a resource was being observed starts no new action (found in review: a restart
// started after SIGTERM).
func TestHoldIsAskedAgainBeforeTheAction(t *testing.T) {
	t.Parallel()
	h := newHost()
	h.values["fake.r"] = "old"
	stop := errors.New("not started: the agent is stopping")
	var asked atomic.Int32
	e := engine(t, h, "fake \"r\" {\n  value = \"new\"\n  restart = true\n}\n", Options{Hold: func(string) error {
		if asked.Add(1) > 1 { // the first ask is before the observation
			return stop
		}
		return nil
	}})
	rep := e.Apply(context.Background(), nil)
	if st := rep.Steps[0]; !errors.Is(st.Err, stop) || st.Applied || h.values["fake.r"] != "old" || h.applies["fake.r"] != 0 {
		t.Errorf("step %+v, value %q, applies %d: want the restart held back", st, h.values["fake.r"], h.applies["fake.r"])
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("Hold asked %d times, want 2", n)
	}
}

// Budget is every step's observe, act and verify under its own timeout, one after another.
func TestBudget(t *testing.T) {
	t.Parallel()
	e := engine(t, newHost(), "fake \"a\" { value = \"1\" }\nfake \"short_timeout\" { value = \"2\" }\n", Options{StepTimeout: time.Minute})
	if got, want := e.Budget(), 3*time.Minute+3*50*time.Millisecond; got != want {
		t.Errorf("Budget = %v, want %v", got, want)
	}
}
