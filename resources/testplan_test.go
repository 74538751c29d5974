package resources

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// The resource tests drive their kinds through the real plan loader and engine, as
// the agent does. These helpers are that path, once.

// loadPlan loads src as dir/plan.hcl with the schemas of kinds and the given -var
// values, failing the test on any diagnostic.
func loadPlan(t testing.TB, dir, src string, kinds []agent.Kind, vars ...string) *plans.Plan {
	t.Helper()
	p, diags := plans.LoadSources(dir, []plans.Source{{Name: filepath.Join(dir, "plan.hcl"), Data: []byte(src)}},
		plans.Options{Schemas: agent.Schemas(kinds), Vars: vars})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	return p
}

// openStore opens the state store at dir, failing the test on an error.
func openStore(t testing.TB, dir string) *state.Store {
	t.Helper()
	store, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// testEngine is a fresh engine for src over store, as a new agent process would start
// one: each call observes the host anew.
func testEngine(t testing.TB, dir, src string, kinds []agent.Kind, store *state.Store, opts agent.Options, vars ...string) *agent.Engine {
	t.Helper()
	e, err := agent.New(loadPlan(t, dir, src, kinds, vars...), kinds, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// bindPlan loads src and binds it with kinds, for the tests of a kind's validation: the
// diagnostics are the loader's when it failed, else Bind's.
func bindPlan(src string, kinds []agent.Kind) (map[string]agent.Resource, hcl.Diagnostics) {
	p, diags := plans.LoadSources("/plans", []plans.Source{{Name: "/plans/plan.hcl", Data: []byte(src)}},
		plans.Options{Schemas: agent.Schemas(kinds)})
	if diags.HasErrors() {
		return nil, diags
	}
	return agent.Bind(p, kinds)
}

// Kinds and KindsFor are resources/registry's, for the tests of the kinds still in this
// package (the registry imports this package, so these tests cannot import it).
func Kinds() []agent.Kind { return KindsFor(HostFromEnv(os.Getenv)) }

func KindsFor(h Machine) []agent.Kind {
	h = h.WithDefaults()
	if h.StopGPUServers == nil {
		h.StopGPUServers = ServerStopper(h.Proc, h.GPU)
	}
	return []agent.Kind{FileKind(), DriverKind(h), ContainerKind(h), DownloadKind(h), ServerKind(h)}
}
