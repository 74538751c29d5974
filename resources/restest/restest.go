// Package restest is the path the resource kinds' tests drive their kinds through: the
// real plan loader and engine, as the agent does. Only tests import it.
package restest

import (
	"path/filepath"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// LoadPlan loads src as dir/plan.hcl with the schemas of kinds and the given -var
// values, failing the test on any diagnostic.
func LoadPlan(t testing.TB, dir, src string, kinds []agent.Kind, vars ...string) *plans.Plan {
	t.Helper()
	p, diags := plans.LoadSources(dir, []plans.Source{{Name: filepath.Join(dir, "plan.hcl"), Data: []byte(src)}},
		plans.Options{Schemas: agent.Schemas(kinds), Vars: vars})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	return p
}

// OpenStore opens the state store at dir, failing the test on an error.
func OpenStore(t testing.TB, dir string) *state.Store {
	t.Helper()
	store, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// Engine is a fresh engine for src over store, as a new agent process would start
// one: each call observes the host anew.
func Engine(t testing.TB, dir, src string, kinds []agent.Kind, store *state.Store, opts agent.Options, vars ...string) *agent.Engine {
	t.Helper()
	e, err := agent.New(LoadPlan(t, dir, src, kinds, vars...), kinds, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// BindPlan loads src and binds it with kinds, for the tests of a kind's validation: the
// diagnostics are the loader's when it failed, else Bind's.
func BindPlan(src string, kinds []agent.Kind) (map[string]agent.Resource, hcl.Diagnostics) {
	p, diags := plans.LoadSources("/plans", []plans.Source{{Name: "/plans/plan.hcl", Data: []byte(src)}},
		plans.Options{Schemas: agent.Schemas(kinds)})
	if diags.HasErrors() {
		return nil, diags
	}
	return agent.Bind(p, kinds)
}
