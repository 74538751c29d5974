package agent

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// working is a kind whose Apply reports its progress as data, as the download kind does.
type working struct{ done bool }

func (w *working) Check(ctx context.Context, env *Env) (*Diff, error) {
	if w.done {
		return NoChange(), nil
	}
	return (&Diff{}).Add(Added("bytes", 10)).Derive(), nil
}

func (w *working) Apply(ctx context.Context, env *Env, d *Diff) error {
	env.Progress(Progress{Addr: "a kind cannot speak for another", Done: 4, Total: 10, ETA: -1})
	env.Progress(Progress{Done: 10, Total: 10, Final: true})
	w.done = true
	return nil
}

// What a step reports of its work reaches Options.Progress, named for the resource by the
// engine, from the step's own goroutine; with nobody listening it goes nowhere.
func TestProgressReachesItsListener(t *testing.T) {
	t.Parallel()
	kind := NewKind("work", func(r *plans.Resource, c *struct {
		Size int `hcl:"size"`
	}) (Resource, hcl.Diagnostics) {
		return &working{}, nil
	})
	newEngine := func(opts Options) *Engine {
		p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(`work "model" { size = 10 }`)}}, plans.Options{Schemas: Schemas([]Kind{kind})})
		if diags.HasErrors() {
			t.Fatal(diags.Error())
		}
		store, err := state.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(p, []Kind{kind}, store, opts)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	var mu sync.Mutex
	var got []Progress
	e := newEngine(Options{Progress: func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, p)
	}})
	if rep := e.Apply(context.Background(), nil); rep.Failed() || !rep.Steps[0].Applied {
		t.Fatalf("apply: %v", rep.Steps[0].Err)
	}
	want := []Progress{{Addr: "work.model", Done: 4, Total: 10, ETA: -1}, {Addr: "work.model", Done: 10, Total: 10, Final: true}}
	if !slices.EqualFunc(got, want, func(a, b Progress) bool {
		return a.Addr == b.Addr && a.Done == b.Done && a.Total == b.Total && a.ETA == b.ETA && a.Final == b.Final
	}) {
		t.Errorf("reported %+v, want %+v", got, want)
	}
	if rep := newEngine(Options{}).Apply(context.Background(), nil); rep.Failed() {
		t.Errorf("apply with nobody listening: %v", rep.Steps[0].Err)
	}
}
