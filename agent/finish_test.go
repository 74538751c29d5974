package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// finConfig is a make-before-break fake: its Apply builds the new value and leaves the
// old one "serving" (host key ADDR#old) until Finish removes it.
type finConfig struct {
	Value      string `hcl:"value"`
	FinishFail *bool  `hcl:"finish_fail,optional"`
	// FinishLies: Finish says it did the work and did not (the old one keeps serving).
	FinishLies *bool `hcl:"finish_lies,optional"`
}

type fin struct {
	h    *host
	addr string
	cfg  *finConfig
	log  *[]string
}

func (f *fin) Check(ctx context.Context, env *Env) (*Diff, error) {
	left := f.unfinished()
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if have := f.h.values[f.addr]; have != f.cfg.Value {
		d := (&Diff{}).Add(Set("value", have, f.cfg.Value).Because(Replaces, ReasonMigrate)).Derive()
		d.Unfinished = left
		return d, nil
	}
	d := NoChange()
	d.Unfinished = left
	return d, nil
}

func (f *fin) Apply(ctx context.Context, env *Env, d *Diff) error {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if old, ok := f.h.values[f.addr]; ok {
		f.h.values[f.addr+"#old"] = old
	}
	f.h.values[f.addr] = f.cfg.Value
	*f.log = append(*f.log, "apply "+f.addr)
	return nil
}

func (f *fin) unfinished() string {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	if old, ok := f.h.values[f.addr+"#old"]; ok {
		return "old value " + old
	}
	return ""
}

func (f *fin) Finish(ctx context.Context, env *Env) error {
	if f.cfg.FinishFail != nil && *f.cfg.FinishFail {
		return errors.New("cannot stop the old one")
	}
	if f.cfg.FinishLies != nil && *f.cfg.FinishLies {
		return nil
	}
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	delete(f.h.values, f.addr+"#old")
	*f.log = append(*f.log, "finish "+f.addr)
	return nil
}

var _ Finisher = (*fin)(nil)

func finEngine(t *testing.T, h *host, store *state.Store, log *[]string, src string, opts Options) *Engine {
	t.Helper()
	k := append(kinds(h), NewKind("fin", func(r *plans.Resource, c *finConfig) (Resource, hcl.Diagnostics) {
		return &fin{h: h, addr: r.Addr, cfg: c, log: log}, nil
	}))
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

const finPlan = `
fin "ctr" { value = "%s" }
fake "srv" {
  value = "${fin.ctr.value}-srv"
  fail  = %s
}
fake "unrelated" { value = "u" }
`

func finSrc(v, fail string) string {
	return strings.Replace(strings.Replace(finPlan, "%s", v, 1), "%s", fail, 1)
}

// TestFinishAfterDependentsVerified: the break work of a make-before-break change is
// done only after every dependent applied and verified in the same apply, dependents
// first; a failed dependent leaves it (the old half keeps serving) with a warning, and
// the next apply that verifies the dependent finishes it; --target without the
// dependents never finishes it.
func TestFinishAfterDependentsVerified(t *testing.T) {
	t.Parallel()
	h := newHost()
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var log []string
	ctx := context.Background()
	mustApply(t, finEngine(t, h, store, &log, finSrc("m2", "false"), Options{}).Apply(ctx, nil))
	log = nil

	// The dependent fails: the old value is left serving, the apply names the dependent.
	rep := finEngine(t, h, store, &log, finSrc("m3", "true"), Options{}).Apply(ctx, nil)
	if !rep.Failed() || h.values["fin.ctr#old"] != "m2" || slices.Contains(log, "finish fin.ctr") {
		t.Fatalf("a failed dependent: log %v, values %v", log, h.values)
	}
	var warned bool
	for _, st := range rep.Steps {
		if st.Addr == "fin.ctr" {
			warned = st.Err == nil && st.Diff != nil && len(st.Diff.Warnings) > 0 && strings.Contains(st.Diff.Warnings[0], "fake.srv")
		}
	}
	if !warned {
		t.Errorf("fin.ctr carries no warning naming fake.srv: %v", outcome(rep))
	}

	// --target fin.ctr: its dependent is not in the run, so nothing is finished.
	mustApply(t, finEngine(t, h, store, &log, finSrc("m3", "false"), Options{Targets: []string{"fin.ctr"}}).Apply(ctx, nil))
	if _, ok := h.values["fin.ctr#old"]; !ok {
		t.Fatal("finished under --target without its dependents")
	}

	// The dependent verifies: finished after it, in the same apply.
	var events []string
	rep = finEngine(t, h, store, &log, finSrc("m3", "false"), Options{}).Apply(ctx, func(ev Event) {
		events = append(events, string(ev.Phase)+" "+ev.Step.Addr)
	})
	mustApply(t, rep)
	if _, ok := h.values["fin.ctr#old"]; ok {
		t.Fatalf("not finished: %v", h.values)
	}
	srv, done := slices.Index(events, "done fake.srv"), slices.Index(events, "finished fin.ctr")
	if srv < 0 || done < srv {
		t.Errorf("events %v: want fake.srv done before fin.ctr finished", events)
	}
	for _, st := range rep.Steps {
		if st.Addr == "fin.ctr" && st.Finished != "old value m2" {
			t.Errorf("Finished = %q", st.Finished)
		}
	}
	// Nothing left: the next apply finishes nothing.
	log = nil
	mustApply(t, finEngine(t, h, store, &log, finSrc("m3", "false"), Options{}).Apply(ctx, nil))
	if len(log) != 0 {
		t.Errorf("a converged apply did %v", log)
	}
}

// TestFinishFailureFailsTheStep: a Finish that fails is the resource's failure, with its
// address, and the break work stays for the next apply. So is a Finish that reports
// success but leaves the old half serving: the engine verifies the break work with a
// fresh Check, as every step, never with what Finish itself just wrote.
func TestFinishFailureFailsTheStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ option, err string }{
		{"finish_fail", "fin.ctr: finish: cannot stop the old one"},
		{"finish_lies", "fin.ctr: finish: still unfinished after finishing: old value m2"},
	} {
		h := newHost()
		h.values["fin.ctr"] = "m2"
		store, err := state.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		var log []string
		rep := finEngine(t, h, store, &log, "fin \"ctr\" {\n  value = \"m3\"\n  "+tc.option+" = true\n}", Options{}).Apply(context.Background(), nil)
		st := rep.Steps[0]
		if st.Err == nil || !strings.HasPrefix(st.Err.Error(), tc.err) || st.Finished != "" {
			t.Fatalf("%s: err = %v, finished %q", tc.option, st.Err, st.Finished)
		}
		if h.values["fin.ctr#old"] != "m2" {
			t.Errorf("%s: values %v", tc.option, h.values)
		}
	}
}

// migMember is a rollout member whose restart is a migration: the old generation keeps
// serving (fleet key ADDR#old) until Finish stops it.
type migMember struct {
	*member
}

func (m migMember) Apply(ctx context.Context, env *Env, d *Diff) error {
	m.f.mu.Lock()
	m.f.values[m.addr+"#old"] = m.f.values[m.addr]
	m.f.mu.Unlock()
	return m.member.Apply(ctx, env, d)
}

func (m migMember) Check(ctx context.Context, env *Env) (*Diff, error) {
	d, err := m.member.Check(ctx, env)
	if d != nil {
		d.Unfinished = m.unfinished()
	}
	return d, err
}

func (m migMember) unfinished() string {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	if _, ok := m.f.values[m.addr+"#old"]; ok {
		return "old generation"
	}
	return ""
}

func (m migMember) Finish(ctx context.Context, env *Env) error {
	m.f.mu.Lock()
	defer m.f.mu.Unlock()
	delete(m.f.values, m.addr+"#old")
	return nil
}

// TestMigrationsRespectRollouts: members of a rollout group whose restarts are
// migrations (Finisher) are still admitted max_unavailable at a time, every one is
// finished once verified, and no permit is left in flight.
func TestMigrationsRespectRollouts(t *testing.T) {
	t.Parallel()
	f := newFleet()
	for _, a := range []string{"a", "b", "c"} {
		f.values["member."+a] = "v1"
	}
	k := []Kind{NewKind("member", func(r *plans.Resource, c *memberConfig) (Resource, hcl.Diagnostics) {
		return migMember{&member{f: f, addr: r.Addr, cfg: c}}, nil
	})}
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(group(3, 1, "v2", nil))}}, plans.Options{Schemas: Schemas(k)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	store, err := state.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(p, k, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rep := e.Apply(context.Background(), nil)
	mustApply(t, rep)
	for _, st := range rep.Steps {
		if st.Finished != "old generation" {
			t.Errorf("%s: finished %q", st.Addr, st.Finished)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peak != 1 {
		t.Errorf("%d members down at once, want 1", f.peak)
	}
	m, err := store.LoadRollouts()
	if err != nil || len(m) != 0 {
		t.Errorf("left in flight: %v %v", m, err)
	}
}
