package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/agent-dev/agent/internal/dag"
	"github.com/agent-dev/agent/internal/state"
)

// Ensurer is implemented by resources a plan can declare absent (ensure = "absent").
type Ensurer interface {
	// Absent reports whether the plan declares the resource absent.
	Absent() bool
	// AsAbsent is the resource as if its block said ensure = "absent", for agent destroy:
	// its Check plans the verified delete, with reason ReasonDestroy.
	AsAbsent() Resource
}

// OrphanMode says what an engine does with orphans: resources recorded in state whose
// blocks are gone from the plan.
type OrphanMode int

const (
	// OrphansByPlan deletes orphans only when the plan says agent { prune = true }, and
	// otherwise reports them (a warning, and the step's drift): the reconcile loop's mode,
	// so that an unattended loop never stops a serving process because a var file went
	// missing. It is the zero value.
	OrphansByPlan OrphanMode = iota
	// OrphansDelete plans and applies their deletion, as Terraform does (plan, apply).
	OrphansDelete
)

// ErrDeletesAll is wrapped by the refusal of an apply that would delete every resource of
// a guarded kind while the plan keeps none.
var ErrDeletesAll = errors.New("refused")

func (e *Engine) pruning() bool {
	return e.destroying || e.opts.Orphans == OrphansDelete || e.plan.Agent.Prune
}

// addrs is every address a run covers: orphans first (they are deleted first), then the
// plan's resources in dependency order, then the orphans that a planned resource's
// current record still depends on (deleted once it is verified: waitingOrphans).
func (e *Engine) addrs() []string {
	var first, last []string
	for _, o := range e.orphans {
		if len(e.after[o]) > 0 {
			last = append(last, o)
		} else {
			first = append(first, o)
		}
	}
	return append(append(first, e.Order()...), last...)
}

func (e *Engine) isOrphan(addr string) bool { return slices.Contains(e.orphans, addr) }

// Orphans returns the orphans this engine found, in the order they are deleted.
func (e *Engine) Orphans() []string { return slices.Clone(e.orphans) }

// findOrphans lists the state records whose addresses are not in the plan (nor the old
// name of a moved block) and asks each one's kind for its deleter. With --target only
// targeted orphans count.
func (e *Engine) findOrphans() error {
	recorded, err := e.store.List()
	if err != nil {
		return err
	}
	moved := map[string]bool{}
	for _, m := range e.plan.Moved {
		moved[m.From] = true
	}
	var found []string
	for _, addr := range recorded {
		if e.plan.Resource(addr) != nil || moved[addr] {
			continue
		}
		if len(e.opts.Targets) > 0 && !slices.Contains(e.opts.Targets, addr) {
			continue
		}
		typ, _, _ := strings.Cut(addr, ".")
		k, ok := e.kinds[typ]
		switch {
		case !ok:
			e.resources[addr] = kept{fmt.Sprintf("recorded in state, but this agent has no kind %q: left alone", typ)}
		case k.Orphan == nil:
			e.resources[addr] = kept{fmt.Sprintf("no longer in the plan; the agent never removes a %s: left as it is (delete %s to forget it)",
				typ, e.store.Dir()+"/resources/"+addr+".json")}
		default:
			r, err := k.Orphan(addr, e.store.For(addr), &e.plan.Agent)
			if err != nil {
				e.resources[addr] = broken{fmt.Errorf("%s: no longer in the plan, and its record cannot be read to delete it: %w", addr, err)}
			} else if r == nil {
				continue // nothing left of it: its record only keeps history
			} else {
				e.resources[addr] = r
			}
		}
		found = append(found, addr)
	}
	// Dependents first, from the dependencies recorded when they were last applied.
	deps, err := e.store.LoadDeps()
	if err != nil {
		return err
	}
	g := &dag.Graph{}
	for _, a := range found {
		g.Add(a)
	}
	for _, a := range found {
		for _, d := range deps[a] {
			if g.Has(d) {
				g.Depend(d, a) // d is deleted after a, which needed it
			}
		}
	}
	order, err := g.Sort()
	if err != nil {
		order = found // a corrupt record of dependencies costs only the order
	}
	e.orphans = order
	e.after = e.waitingOrphans(order, deps)
	return nil
}

// kept is an orphan the agent does not delete: observed as a no-op with a warning.
type kept struct{ why string }

func (k kept) Check(context.Context, *Env) (*Diff, error) {
	return &Diff{Action: NoOp, Warnings: []string{k.why}}, nil
}
func (k kept) Apply(context.Context, *Env, *Diff) error { return nil }

// broken is an orphan whose deleter could not be built: every step fails with why.
type broken struct{ err error }

func (b broken) Check(context.Context, *Env) (*Diff, error) { return nil, b.err }
func (b broken) Apply(context.Context, *Env, *Diff) error   { return b.err }

// stateFor is the record a resource reads: its own, or, while a moved block's rename is
// not carried out yet (plan, status), the old address's, so that a rename shows as no
// change and never as an adoption.
func (e *Engine) stateFor(addr string) *state.Scoped {
	if from, ok := e.movedFrom[addr]; ok {
		hasNew, _ := e.store.Has(addr)
		hasOld, _ := e.store.Has(from)
		if !hasNew && hasOld {
			return e.store.For(from)
		}
	}
	return e.store.For(addr)
}

// move carries out the plan's moved blocks: each old record becomes the new one, as it
// is (a server keeps its PID, generation and logs; nothing restarts). Both present is an
// error: two records would describe one thing.
func (e *Engine) move() error {
	for _, m := range e.plan.Moved {
		if len(e.opts.Targets) > 0 && !e.graph.Has(m.To) {
			continue
		}
		hasOld, err := e.store.Has(m.From)
		if err != nil {
			return err
		}
		if !hasOld {
			continue // moved already, or never recorded
		}
		hasNew, err := e.store.Has(m.To)
		if err != nil {
			return err
		}
		if hasNew {
			return fmt.Errorf("moved block at %s: both %s and %s have a state record; the agent will not merge them (stop what %s runs with agent destroy --target %s, or remove the moved block)",
				m.DeclRange, m.From, m.To, m.To, m.To)
		}
		if err := e.store.Move(m.From, m.To); err != nil {
			return fmt.Errorf("moved block at %s: %w", m.DeclRange, err)
		}
		e.log.Info("moved", "from", m.From, "to", m.To)
	}
	return nil
}

// saveDeps records what each applied resource depends on, for ordering it as an orphan
// later; orphans deleted and verified are forgotten.
func (e *Engine) saveDeps(rep *Report) {
	deps, err := e.store.LoadDeps()
	if err != nil {
		return
	}
	for _, st := range rep.Steps {
		switch {
		case st.Orphan && st.Applied:
			delete(deps, st.Addr)
		case !st.Orphan && e.plan.Resource(st.Addr) != nil:
			deps[st.Addr] = keptDeps(st, deps[st.Addr], e.plan.Resource(st.Addr).DependsOn)
		}
	}
	for from, to := range e.movedFromPairs() {
		if d, ok := deps[from]; ok {
			if _, has := deps[to]; !has {
				deps[to] = d
			}
			delete(deps, from)
		}
	}
	if err := e.store.SaveDeps(deps); err != nil {
		e.log.Warn("could not record dependencies", "err", err)
	}
}

func (e *Engine) movedFromPairs() map[string]string {
	m := map[string]string{}
	for to, from := range e.movedFrom {
		m[from] = to
	}
	return m
}

// guardDeleteAll refuses, for each guarded kind (Kind.Guarded: server), deleting every
// orphan of that kind when the plan keeps none of it: the plan of a host whose var file
// went missing is empty, and its apply must not stop every server. An explicit
// ensure = "absent" is the plan's own word and is never refused. It returns the refused
// addresses; Options.AllowDeleteAll skips it.
func (e *Engine) guardDeleteAll(ctx context.Context) map[string]error {
	refused := map[string]error{}
	for typ, k := range e.kinds {
		if !k.Guarded {
			continue
		}
		keeps := false
		for _, r := range e.plan.Resources {
			if en, ok := e.resources[r.Addr].(Ensurer); r.Type == typ && !(ok && en.Absent()) {
				keeps = true
			}
		}
		if keeps {
			continue
		}
		var deletes []string
		for _, o := range e.orphans {
			if !strings.HasPrefix(o, typ+".") {
				continue
			}
			if d, err := e.check(ctx, o); err == nil && d.Action == Delete {
				deletes = append(deletes, o)
			}
		}
		if len(deletes) == 0 {
			continue
		}
		sort.Strings(deletes)
		err := fmt.Errorf("%w: every %s this agent manages (%s) would be deleted, and the plan declares none; if that is intended pass --allow-delete-all, or use agent destroy (a missing -var-file can empty a plan)",
			ErrDeletesAll, typ, strings.Join(deletes, ", "))
		for _, a := range deletes {
			refused[a] = err
		}
	}
	return refused
}

// orphanStatus is the status of an orphan: degraded (it is not what the plan says), with
// what apply would do to it.
func (e *Engine) orphanStatus(ctx context.Context, st *Step) {
	d, err := e.check(ctx, st.Addr)
	st.Diff, st.Err = d, err
	if err != nil {
		return
	}
	sum := "orphan: no longer in the plan"
	if d.Action != NoOp {
		sum += "; agent apply will " + string(d.Action) + " it (agent run only with agent { prune = true })"
		if after := e.after[st.Addr]; len(after) > 0 && d.Action == Delete {
			sum += ", " + DeletedAfterText(after)
		}
	}
	st.Status = &Status{Healthy: false, Summary: sum, Metrics: map[string]float64{"orphan": 1}}
	for i, w := range d.Warnings {
		st.Status.Fields = append(st.Status.Fields, TextField(fmt.Sprintf("warning[%d]", i+1), "warning", w))
	}
}

// Destroy stops and removes everything the plan manages (and every orphan), dependents
// first, each step verified as in Apply: resources that can be absent (Ensurer) are
// deleted, the others (a kernel driver) are kept and say so. With targets, a target and
// what depends on it.
func (e *Engine) Destroy(ctx context.Context, onEvent func(Event)) *Report {
	full := &dag.Graph{}
	for _, r := range e.plan.Resources {
		full.Add(r.Addr)
	}
	for _, r := range e.plan.Resources {
		for _, d := range r.DependsOn {
			full.Depend(d, r.Addr) // reversed: a dependency goes after what needs it
		}
	}
	g := full
	if len(e.opts.Targets) > 0 {
		// A target and what depends on it; never everything because a target is not
		// in the plan.
		var in []string
		for _, t := range e.opts.Targets {
			if full.Has(t) {
				in = append(in, t)
			}
		}
		g = &dag.Graph{}
		if sub, err := full.Closure(in); err == nil && len(in) > 0 {
			g = sub
		}
	}
	resources := map[string]Resource{}
	for _, a := range e.orphans {
		resources[a] = e.resources[a]
	}
	for _, a := range g.Nodes() {
		r := e.resources[a]
		if en, ok := r.(Ensurer); ok {
			resources[a] = en.AsAbsent()
		} else {
			typ, _, _ := strings.Cut(a, ".")
			resources[a] = kept{fmt.Sprintf("kept: agent destroy never removes a %s", typ)}
		}
	}
	d := *e
	d.resources, d.graph, d.destroying = resources, g, true
	rep := d.Apply(ctx, onEvent)
	e.recordDestroyed(rep, resources)
	return rep
}
