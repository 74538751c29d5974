package agent

import (
	"context"
	"slices"
	"sync"
	"time"
)

// The engine's per-resource API, for a reconcile loop (`agent run`) that keeps each
// resource converged on its own clock instead of applying the whole plan in passes. The
// loop owns the schedule (a work queue, timers, backoff, which dependencies have
// converged); the engine owns what one resource's reconcile is, the same
// observe → act → verify as Apply's step (applyOne), under the same holds, timeouts and
// panic guard.

// Addrs returns the addresses the engine acts on: orphans first, then the plan's
// resources in dependency order.
func (e *Engine) Addrs() []string { return e.addrs() }

// Has reports whether the engine acts on addr.
func (e *Engine) Has(addr string) bool { return e.graph.Has(addr) || e.isOrphan(addr) }

// Prepare does, under the state lock, what Apply does once before its walk: it carries
// out the plan's moved blocks (a record renamed, nothing restarted) and finds which
// orphan deletes the delete-all guard refuses. A loop calls it once per engine, before
// its first Reconcile; an error (both records of a move exist) means the plan cannot run.
func (e *Engine) Prepare(ctx context.Context) error {
	if err := e.move(); err != nil {
		return err
	}
	if !e.opts.AllowDeleteAll && !e.destroying {
		e.refused = e.guardDeleteAll(ctx)
	}
	if e.rollouts != nil {
		return e.rollouts.prune(e.groupOf)
	}
	if e.opts.Rollouts != nil && !e.destroying {
		// No group left in the plan: the loop's permits forget its members.
		return e.opts.Rollouts.prune(nil)
	}
	return nil
}

// recordMu serialises the read-modify-write of the dependencies record between
// concurrent reconciles.
var recordMu sync.Mutex

// Record keeps what a verified reconcile teaches the state: what the resource depends on
// (to order it as an orphan later), or, for an orphan deleted, that it is gone.
func (e *Engine) Record(st *Step) {
	recordMu.Lock()
	defer recordMu.Unlock()
	e.saveDeps(&Report{Steps: []*Step{st}})
}

// Deps returns the direct dependencies of addr: for an orphan, the planned resources
// whose current record still depends on it (Step.DeletedAfter), which it waits for as a
// resource waits for its dependencies.
func (e *Engine) Deps(addr string) []string {
	if e.isOrphan(addr) {
		return slices.Clone(e.after[addr])
	}
	return e.graph.Deps(addr)
}

// IsOrphan reports whether addr is an orphan: recorded in state, its block gone.
func (e *Engine) IsOrphan(addr string) bool { return e.isOrphan(addr) }

// Upstream returns the resources addr depends on, directly or not, in plan order.
func (e *Engine) Upstream(addr string) []string { return e.graph.Upstream(addr) }

// Dependents returns the resources that depend directly on addr, in dependency order.
func (e *Engine) Dependents(addr string) []string {
	var out []string
	for _, a := range e.Order() {
		if slices.Contains(e.graph.Deps(a), addr) {
			out = append(out, a)
		}
	}
	return out
}

// StepTimeout is the bound of one step (observe, act or verify) of addr.
func (e *Engine) StepTimeout(addr string) time.Duration { return e.timeout(addr) }

// Reconcile is one resource's observe → act → verify, exactly as in Apply: Hold is asked
// before observing and again before acting; the step succeeds only when a fresh Check
// after acting finds nothing to do. It does not look at dependencies: the caller acts on
// a resource only once they converged.
func (e *Engine) Reconcile(ctx context.Context, addr string) *Step {
	st := e.newStep(addr)
	start := time.Now()
	st.Err = e.applyOne(ctx, st, func() {}, nil)
	st.Duration = time.Since(start)
	return st
}

// Observe runs addr's Check alone (under its timeout): what Reconcile would act on, with
// nothing changed and nothing recorded (as a plan). A loop uses it to see whether the
// host moved under a held resource.
func (e *Engine) Observe(ctx context.Context, addr string) (*Diff, error) {
	return e.check(ctx, addr)
}

// StatusOf is addr's live status, as Status reports it. d, when not nil, is a diff the
// caller observed moments ago: a resource without its own Status is then judged from it
// instead of being observed again.
func (e *Engine) StatusOf(ctx context.Context, addr string, d *Diff) *Step {
	st := e.newStep(addr)
	start := time.Now()
	defer func() { st.Duration = time.Since(start) }()
	if st.Orphan {
		e.orphanStatus(ctx, st)
		return st
	}
	if e.destroyedStatus(ctx, st) {
		return st
	}
	if s, ok := e.resources[addr].(Statuser); ok {
		st.Err = e.guard(ctx, addr, "status", func(ctx context.Context) error {
			var err error
			st.Status, err = s.Status(ctx, e.env(addr))
			return err
		})
		if st.Err != nil {
			st.Err = withAddr(addr, "status", st.Err)
		}
		return st
	}
	if d == nil {
		var err error
		if d, err = e.check(ctx, addr); err != nil {
			st.Err = err
			return st
		}
	}
	st.Diff = d
	if d.Action == NoOp {
		st.Status = &Status{Healthy: true, Summary: "matches the plan"}
	} else {
		st.Status = &Status{Healthy: false, Summary: "drift: " + describe(d)}
	}
	return st
}

// newStep is addr's step as a report holds it.
func (e *Engine) newStep(addr string) *Step {
	return &Step{Addr: addr, Orphan: e.isOrphan(addr), MovedFrom: e.movedFrom[addr], DeletedAfter: e.after[addr]}
}

// Watch blocks until addr may have changed (Watcher) or ctx ends. It returns
// ErrNothingToWatch at once for a resource that is not a Watcher or has nothing to watch.
func (e *Engine) Watch(ctx context.Context, addr string) error {
	w, ok := e.resources[addr].(Watcher)
	if !ok {
		return ErrNothingToWatch
	}
	return w.Watch(ctx, e.env(addr))
}

// PhaseFunc is told when a guarded step of a resource starts ("observe", "status", or
// the action) and how long it may take: a loop's watchdog calls a step stuck only once
// it runs past its own limit.
type PhaseFunc func(addr, what string, limit time.Duration)

type phaseKey struct{}

// WithPhase returns a context whose guarded steps report to fn as they start.
func WithPhase(ctx context.Context, fn PhaseFunc) context.Context {
	return context.WithValue(ctx, phaseKey{}, fn)
}

// notePhase tells the context's PhaseFunc, if any, that a step starts.
func notePhase(ctx context.Context, addr, what string, limit time.Duration) {
	if fn, ok := ctx.Value(phaseKey{}).(PhaseFunc); ok {
		fn(addr, what, limit)
	}
}
