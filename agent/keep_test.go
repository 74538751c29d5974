package agent

import (
	"context"
	"errors"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// noter is a kind whose Check finds what its record must say (a time first seen, say)
// and returns it as data; it also tries to write, which an observation must not do.
type noterConfig struct {
	Note string `hcl:"note"`
}

type noter struct{ cfg *noterConfig }

func (n *noter) Check(ctx context.Context, env *Env) (*Diff, error) {
	var rec map[string]string
	if _, err := env.State.Load(&rec); err != nil {
		return nil, err
	}
	if err := env.State.Save(map[string]string{"note": "written by Check"}); !errors.Is(err, state.ErrReadOnly) {
		return nil, errors.New("Check could write its record")
	}
	d := NoChange()
	if rec["note"] != n.cfg.Note {
		d.Record = SaveRecord(map[string]string{"note": n.cfg.Note}, "noted")
	}
	return d, nil
}

func (n *noter) Apply(context.Context, *Env, *Diff) error {
	return errors.New("a no-op is never applied")
}

// TestRecordUpdatesAreKeptByTheEngine (issue 24): a Check's record is read-only; what it
// found comes back as data, which a plan drops and an apply keeps, also for a no-op.
func TestRecordUpdatesAreKeptByTheEngine(t *testing.T) {
	t.Parallel()
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k := []Kind{NewKind("noter", func(r *plans.Resource, c *noterConfig) (Resource, hcl.Diagnostics) {
		return &noter{cfg: c}, nil
	})}
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(`noter "n" { note = "seen" }`)}}, plans.Options{Schemas: Schemas(k)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	e, err := New(p, k, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := e.Plan(context.Background()).Steps[0]
	if st.Err != nil || st.Diff.Action != NoOp || st.Diff.Record == nil {
		t.Fatalf("plan: %v %+v", st.Err, st.Diff)
	}
	if has, _ := store.Has("noter.n"); has {
		t.Fatal("the plan wrote a record")
	}
	if st := e.Apply(context.Background(), nil).Steps[0]; st.Err != nil || st.Applied {
		t.Fatalf("apply: %v applied %v", st.Err, st.Applied)
	}
	var rec map[string]string
	if ok, err := store.Load("noter.n", &rec); !ok || err != nil || rec["note"] != "seen" {
		t.Fatalf("the apply did not keep the record update: %v %v %v", ok, err, rec)
	}
	if st := e.Plan(context.Background()).Steps[0]; st.Err != nil || st.Diff.Record != nil {
		t.Fatalf("plan after: %v %+v", st.Err, st.Diff)
	}
}
