package agent

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// A model switch as the engine sees it (issue 35, point 1): v1 has rec.m1 and rec.s
// launched from it; v2 removes m1 (an orphan), adds m2 and moves s to it. The plan says
// m1 is deleted after s is verified; an apply whose s fails keeps m1 (with why) and
// remembers that s's record still needs it; an apply whose s succeeds deletes m1 after
// s verified, in the same apply.
func TestOrphanThatWhatServesNeedsIsDeletedAfterIt(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	const v1 = `
rec "m1" { value = "w1" }
rec "s" { value = "from ${rec.m1.value}" }
`
	const v2 = `
rec "m2" { value = "w2" }
rec "s" {
  value = "from ${rec.m2.value}"
  fail  = %s
}
`
	mustApply(t, recEngine(t, store, log, v1, Options{}).Apply(context.Background(), nil))
	failing, good := strings.Replace(v2, "%s", "true", 1), strings.Replace(v2, "%s", "false", 1)

	plan := recEngine(t, store, log, failing, Options{Orphans: OrphansDelete}).Plan(context.Background())
	last := plan.Steps[len(plan.Steps)-1]
	if last.Addr != "rec.m1" || last.Diff.Action != Delete || !slices.Equal(last.DeletedAfter, []string{"rec.s"}) {
		t.Fatalf("plan: the orphan is not shown last, deleted after rec.s: %+v", last)
	}
	if got := DeletedAfterText(last.DeletedAfter); got != "deleted after rec.s is verified" {
		t.Errorf("DeletedAfterText = %q", got)
	}

	rep := recEngine(t, store, log, failing, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil)
	if len(log.order) != 0 {
		t.Fatalf("the way back was deleted although rec.s failed: %v", log.order)
	}
	m1 := stepOf(rep, "rec.m1")
	if m1.Err != nil || m1.Applied || m1.Diff == nil || !strings.Contains(strings.Join(m1.Diff.Warnings, " "), "kept: rec.s's last good generation was launched from it") {
		t.Fatalf("rec.m1 not reported kept with why: %+v %v", m1.Diff, m1.Err)
	}
	if has, _ := store.Has("rec.m1"); !has {
		t.Fatal("rec.m1's record is gone")
	}
	deps, _ := store.LoadDeps()
	if !slices.Contains(deps["rec.s"], "rec.m1") || !slices.Contains(deps["rec.s"], "rec.m2") {
		t.Fatalf("deps.json forgot what rec.s's current record needs: %v", deps["rec.s"])
	}

	var mu sync.Mutex
	var events []string
	rep = recEngine(t, store, log, good, Options{Orphans: OrphansDelete}).Apply(context.Background(), func(ev Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, string(ev.Phase)+" "+ev.Step.Addr)
	})
	mustApply(t, rep)
	if !slices.Equal(log.order, []string{"rec.m1"}) {
		t.Fatalf("deleted %v, want rec.m1 in the same apply", log.order)
	}
	if i, j := slices.Index(events, "done rec.s"), slices.Index(events, "start rec.m1"); i < 0 || j < i {
		t.Errorf("rec.m1 was deleted before rec.s was verified: %v", events)
	}
	deps, _ = store.LoadDeps()
	if _, ok := deps["rec.m1"]; ok || slices.Contains(deps["rec.s"], "rec.m1") {
		t.Errorf("deps.json after the switch: %v", deps)
	}
}

// The loop waits for a dependent as for a dependency: an orphan's Deps are the planned
// resources whose records need it; an orphan nothing planned needs has none.
func TestOrphanWaitsInTheLoopForWhatNeedsIt(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, recChain+`rec "s" { value = "from ${rec.c.value}" }`, Options{}).Apply(context.Background(), nil))
	e := recEngine(t, store, log, `rec "s" { value = "other" }`, Options{})
	// s needs c, which needs b, which needs a: all three wait for s.
	for _, o := range []string{"rec.a", "rec.b", "rec.c"} {
		if got := e.Deps(o); !slices.Equal(got, []string{"rec.s"}) {
			t.Errorf("Deps(%s) = %v, want [rec.s]", o, got)
		}
	}
	e = recEngine(t, store, log, `rec "z" { value = "z" }`, Options{AllowDeleteAll: true})
	for _, o := range []string{"rec.a", "rec.b", "rec.c", "rec.s"} {
		if got := e.Deps(o); len(got) != 0 {
			t.Errorf("Deps(%s) = %v, want none", o, got)
		}
	}
}

func stepOf(rep *Report, addr string) *Step {
	for _, st := range rep.Steps {
		if st.Addr == addr {
			return st
		}
	}
	return nil
}

// The new weights' download fails half way: the server is skipped, and the old weights,
// which its running generation needs, are kept.
func TestOrphanKeptWhenTheNewDependencyFails(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, `
rec "m1" { value = "w1" }
rec "s" { value = "from ${rec.m1.value}" }
`, Options{}).Apply(context.Background(), nil))
	rep := recEngine(t, store, log, `
rec "m2" {
  value = "w2"
  fail  = true
}
rec "s" { value = "from ${rec.m2.value}" }
`, Options{Orphans: OrphansDelete}).Apply(context.Background(), nil)
	if len(log.order) != 0 {
		t.Fatalf("deleted %v although rec.m2 failed and rec.s still runs from rec.m1", log.order)
	}
	if _, skipped := stepOf(rep, "rec.s").Skipped(); !skipped {
		t.Fatalf("rec.s: %v", stepOf(rep, "rec.s").Err)
	}
	if m1 := stepOf(rep, "rec.m1"); m1.Diff == nil || !strings.Contains(strings.Join(m1.Diff.Warnings, " "), "kept: rec.s's last good generation") {
		t.Errorf("rec.m1 not reported kept: %+v", m1.Diff)
	}
}

// repeater finds the same thing at every observation (a wedge it cannot act on yet).
type repeaterConfig struct {
	Why string `hcl:"why"`
}

type repeater struct{ cfg *repeaterConfig }

func (r *repeater) Check(context.Context, *Env) (*Diff, error) {
	d := NoChange()
	d.Record = SaveRecord(map[string]string{"why": r.cfg.Why}, r.cfg.Why)
	return d, nil
}

func (r *repeater) Apply(context.Context, *Env, *Diff) error { return nil }

// Issue 35, point 2: a judgement kept again at every pass (the loop could not act on
// it yet) is logged once at info; a new one is logged again.
func TestSameFindingIsLoggedOnce(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	k := []Kind{NewKind("repeater", func(r *plans.Resource, c *repeaterConfig) (Resource, hcl.Diagnostics) {
		return &repeater{cfg: c}, nil
	})}
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	mem := NewMemory()
	for _, why := range []string{"generation 1 found wedged", "generation 1 found wedged", "generation 1 found wedged", "generation 2 found wedged"} {
		p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(`repeater "r" { why = "` + why + `" }`)}}, plans.Options{Schemas: Schemas(k)})
		if diags.HasErrors() {
			t.Fatal(diags.Error())
		}
		e, err := New(p, k, store, Options{Log: logger, Memory: mem})
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, e.Apply(context.Background(), nil))
	}
	if n := strings.Count(buf.String(), `msg=recorded resource=repeater.r what="generation 1 found wedged"`); n != 1 {
		t.Errorf("the same finding was logged %d times, want once:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), `what="generation 2 found wedged"`) {
		t.Errorf("a new finding was not logged:\n%s", buf.String())
	}
}
