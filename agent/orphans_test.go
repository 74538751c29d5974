package agent

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// recorded is a kind whose resources exist as their state record (value), so that
// orphans, moves and destroy can be observed; deletes go to a shared log, in order.
type recConfig struct {
	Value  string  `hcl:"value"`
	Ensure *string `hcl:"ensure,optional"`
	Fail   bool    `hcl:"fail,optional"` // its apply fails, changing nothing
}

type recRes struct {
	addr    string
	value   string
	absent  bool
	why     Reason
	fail    bool
	deletes *deleteLog
}

type deleteLog struct {
	mu    sync.Mutex
	order []string
}

func (r *recRes) Check(ctx context.Context, env *Env) (*Diff, error) {
	var have string
	has, err := env.State.Load(&have)
	if err != nil {
		return nil, err
	}
	switch {
	case r.absent && has:
		return (&Diff{}).Add(Removed("value", have).Because(Deletes, r.why)), nil
	case r.absent:
		return NoChange(), nil
	case !has:
		return (&Diff{}).Add(Added("value", r.value).Because(Creates, ReasonMissing)), nil
	case have != r.value:
		return (&Diff{}).Add(Set("value", have, r.value)), nil
	}
	return NoChange(), nil
}

func (r *recRes) Apply(ctx context.Context, env *Env, d *Diff) error {
	if r.absent {
		time.Sleep(5 * time.Millisecond) // let a wrong order show
		r.deletes.mu.Lock()
		r.deletes.order = append(r.deletes.order, r.addr)
		r.deletes.mu.Unlock()
		return env.State.Delete()
	}
	if r.fail {
		return errors.New("the new value failed and was rolled back")
	}
	return env.State.Save(r.value)
}

func (r *recRes) Absent() bool { return r.absent && r.why == ReasonEnsureAbsent }
func (r *recRes) AsAbsent() Resource {
	return &recRes{addr: r.addr, absent: true, why: ReasonDestroy, deletes: r.deletes}
}

func recKinds(log *deleteLog) []Kind {
	k := NewKind("rec", func(r *plans.Resource, c *recConfig) (Resource, hcl.Diagnostics) {
		res := &recRes{addr: r.Addr, value: c.Value, fail: c.Fail, deletes: log}
		if c.Ensure != nil && *c.Ensure == "absent" {
			res.absent, res.why = true, ReasonEnsureAbsent
		}
		return res, nil
	})
	k.Orphan = func(addr string, st *state.Scoped, _ *plans.AgentSettings) (Resource, error) {
		return &recRes{addr: addr, absent: true, why: ReasonOrphan, deletes: log}, nil
	}
	k.Guarded = true
	return []Kind{k}
}

func recEngine(t *testing.T, store *state.Store, log *deleteLog, src string, opts Options) *Engine {
	t.Helper()
	k := recKinds(log)
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(src)}}, plans.Options{Schemas: Schemas(k)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	e, err := New(p, k, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

const recChain = `
rec "a" { value = "1" }
rec "b" { value = "${rec.a.value}-2" }
rec "c" {
  value      = "3"
  depends_on = [rec.b]
}
`

func mustApply(t *testing.T, rep *Report) {
	t.Helper()
	for _, st := range rep.Steps {
		if st.Err != nil {
			t.Fatalf("%s: %v", st.Addr, st.Err)
		}
	}
}

// agent destroy deletes dependents first, each verified; a second destroy is a no-op.
func TestDestroyReverseDependencyOrder(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, recChain, Options{Parallelism: 4}).Apply(context.Background(), nil))
	rep := recEngine(t, store, log, recChain, Options{Parallelism: 4}).Destroy(context.Background(), nil)
	mustApply(t, rep)
	if want := []string{"rec.c", "rec.b", "rec.a"}; !slices.Equal(log.order, want) {
		t.Errorf("destroy order %v, want %v", log.order, want)
	}
	for _, st := range rep.Steps {
		if !st.Applied || st.Diff.Action != Delete || st.Diff.Changes[0].Why() != ReasonDestroy {
			t.Errorf("%s: applied %v %+v", st.Addr, st.Applied, st.Diff)
		}
	}
	if got, _ := store.List(); len(got) != 0 {
		t.Errorf("records after destroy: %v", got)
	}
	rep = recEngine(t, store, log, recChain, Options{}).Destroy(context.Background(), nil)
	if rep.Changes() {
		t.Errorf("second destroy: %+v", rep.Summary())
	}
}

// Orphans are planned as deletes (OrphansDelete), applied before the plan's resources,
// dependents first from the dependencies recorded when they were applied; with the
// loop's mode and no prune they are reported only.
func TestOrphansDeletedDependentsFirstOrReported(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, recChain, Options{}).Apply(context.Background(), nil))
	const other = `rec "z" { value = "z" }`

	plan := recEngine(t, store, log, other, Options{Orphans: OrphansDelete}).Plan(context.Background())
	if s := plan.Summary(); s.Delete != 3 || s.Create != 1 {
		t.Fatalf("plan: %+v", s)
	}
	rep := recEngine(t, store, log, other, Options{}).Apply(context.Background(), nil)
	mustApply(t, rep)
	if len(log.order) != 0 {
		t.Fatalf("the loop's mode deleted %v", log.order)
	}
	for _, st := range rep.Steps {
		if st.Orphan && (st.Applied || !strings.Contains(strings.Join(st.Diff.Warnings, " "), "prune")) {
			t.Errorf("%s reported as %+v", st.Addr, st.Diff)
		}
	}
	rep = recEngine(t, store, log, other, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil)
	mustApply(t, rep)
	if want := []string{"rec.c", "rec.b", "rec.a"}; !slices.Equal(log.order, want) {
		t.Errorf("orphan delete order %v, want %v", log.order, want)
	}
	if got, _ := store.List(); !slices.Equal(got, []string{"rec.z"}) {
		t.Errorf("records: %v", got)
	}
}

// An apply that would delete every resource of a guarded kind while the plan declares
// none is refused (nothing deleted); --allow-delete-all lets it through; an explicit
// ensure = "absent" is never refused.
func TestDeleteAllGuard(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, `rec "a" { value = "1" }`, Options{}).Apply(context.Background(), nil))
	rep := recEngine(t, store, log, ``, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil)
	if st := rep.Steps[0]; !errors.Is(st.Err, ErrDeletesAll) || len(log.order) != 0 {
		t.Fatalf("guard: %v, deleted %v", st.Err, log.order)
	}
	absent := `rec "a" {
  value  = "1"
  ensure = "absent"
}`
	mustApply(t, recEngine(t, store, log, absent, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil))
	if !slices.Equal(log.order, []string{"rec.a"}) {
		t.Fatalf("ensure = absent: deleted %v", log.order)
	}
	mustApply(t, recEngine(t, store, log, `rec "b" { value = "1" }`, Options{}).Apply(context.Background(), nil))
	mustApply(t, recEngine(t, store, log, ``, Options{Orphans: OrphansDelete, AllowDeleteAll: true}).Apply(context.Background(), nil))
	if !slices.Equal(log.order, []string{"rec.a", "rec.b"}) {
		t.Fatalf("with AllowDeleteAll: deleted %v", log.order)
	}
}

// A moved block moves the record (nothing created, nothing deleted); both addresses
// recorded is an error, never a merge.
func TestMovedMovesTheRecord(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, `rec "a" { value = "1" }`, Options{}).Apply(context.Background(), nil))
	renamed := "rec \"b\" { value = \"1\" }\nmoved {\n  from = rec.a\n  to   = rec.b\n}\n"
	plan := recEngine(t, store, log, renamed, Options{Orphans: OrphansDelete}).Plan(context.Background())
	if plan.Changes() || len(plan.Steps) != 1 || plan.Steps[0].MovedFrom != "rec.a" {
		t.Fatalf("plan of a rename: %+v %+v", plan.Summary(), plan.Steps[0])
	}
	mustApply(t, recEngine(t, store, log, renamed, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil))
	if got, _ := store.List(); !slices.Equal(got, []string{"rec.b"}) || len(log.order) != 0 {
		t.Fatalf("records %v, deleted %v", got, log.order)
	}
	if err := store.Save("rec.a", "1"); err != nil {
		t.Fatal(err)
	}
	rep := recEngine(t, store, log, renamed, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil)
	if st := rep.Steps[0]; st.Err == nil || !strings.Contains(st.Err.Error(), "both rec.a and rec.b") {
		t.Fatalf("both recorded: %v", st.Err)
	}
}

// TestReasonsDocumented keeps docs/json-output.md's reason list equal to the fixed set.
func TestReasonsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/json-output.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range Reasons {
		if !strings.Contains(string(doc), "`"+string(r)+"`") {
			t.Errorf("reason %s is not in docs/json-output.md", r)
		}
	}
}

// agent destroy --target deletes the target and what depends on it, nothing else.
func TestDestroyTargetTakesItsDependents(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, recChain, Options{}).Apply(context.Background(), nil))
	mustApply(t, recEngine(t, store, log, recChain, Options{Targets: []string{"rec.b"}}).Destroy(context.Background(), nil))
	if want := []string{"rec.c", "rec.b"}; !slices.Equal(log.order, want) {
		t.Errorf("destroy --target rec.b deleted %v, want %v", log.order, want)
	}
	if got, _ := store.List(); !slices.Equal(got, []string{"rec.a"}) {
		t.Errorf("records: %v", got)
	}
}
