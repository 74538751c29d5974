package agent

import (
	"context"
	"fmt"
)

// Finisher is implemented by resources whose apply can leave break work for later: a
// make-before-break change builds the new thing and leaves the old one serving (a
// container migrated to another member keeps its old instance; the server in it keeps
// its old process) until what depends on the new one has proved it works. The engine
// finishes such a resource only after every resource of the plan that depends on it
// applied and verified converged in the same apply (in `agent run`: once each of them
// last verified converged). If one of them fails, nothing is broken: the old thing keeps
// serving, and a later apply finishes once they converge.
//
// The engine knows no kind: what is unfinished is what the resource's Check reports
// (Diff.Unfinished), observed like every other fact, and a finish is verified by a
// fresh Check, like every other step.
type Finisher interface {
	// Finish carries the break work out and verifies it (a process stopped with proof,
	// an instance gone from the API), recording each step first so that an agent killed
	// midway finishes on its next run.
	Finish(ctx context.Context, env *Env) error
}

// PlanDependents returns every resource of the whole plan that depends on addr, directly
// or not: what must have verified before addr's break work is done. It ignores
// --target, on purpose: a dependent left out of the run has not verified in it.
func (e *Engine) PlanDependents(addr string) []string { return e.full.Dependents(addr) }

// Finish does the break work st's last observation reported (st.Unfinished) under the
// step timeout and panic guard, and verifies it with a fresh Check: the step succeeds
// only when that Check reports no break work left. It then sets st.Finished to what was
// done. Nil at once when nothing is unfinished.
func (e *Engine) Finish(ctx context.Context, st *Step) error {
	addr, what := st.Addr, st.Unfinished
	f, ok := e.resources[addr].(Finisher)
	if !ok || what == "" {
		return nil
	}
	e.log.Info("finishing", "resource", addr, "work", what)
	err := e.guard(ctx, addr, "finish", func(ctx context.Context) error {
		return f.Finish(ctx, e.env(addr))
	})
	if err != nil {
		return withAddr(addr, "finish", err)
	}
	after, err := e.observe(ctx, addr)
	if err != nil {
		return fmt.Errorf("%w (while verifying the finish)", err)
	}
	if after.Unfinished != "" {
		return fmt.Errorf("%s: finish: still unfinished after finishing: %s", addr, after.Unfinished)
	}
	st.Finished, st.Unfinished = what, ""
	e.log.Info("finished and verified", "resource", addr)
	return nil
}

// finishAll is Apply's last phase: each resource with break work left, dependents first
// (a server's retiring process is stopped before the instance it runs in is deleted),
// is finished when every resource of the plan that depends on it is in this run and
// verified converged. A resource whose dependents did not is left as it is, with a
// warning naming them: its old half keeps serving until they do.
func (e *Engine) finishAll(ctx context.Context, byAddr map[string]*Step, emit func(*Step, string)) {
	order := e.Order()
	for i := len(order) - 1; i >= 0; i-- {
		addr := order[i]
		st := byAddr[addr]
		if st == nil || st.Err != nil || ctx.Err() != nil || st.Unfinished == "" {
			continue
		}
		if _, ok := e.resources[addr].(Finisher); !ok {
			continue
		}
		var waiting []string
		for _, dep := range e.PlanDependents(addr) {
			if ds := byAddr[dep]; ds == nil || ds.Err != nil || ds.Diff == nil {
				waiting = append(waiting, dep)
			}
		}
		if len(waiting) > 0 {
			if st.Diff != nil {
				st.Diff.Warnings = append(st.Diff.Warnings, fmt.Sprintf("%s; left until %v verify in an apply", st.Unfinished, waiting))
			}
			e.log.Warn("not finished: dependents have not verified", "resource", addr, "work", st.Unfinished, "waiting_for", waiting)
			continue
		}
		if err := e.Finish(ctx, st); err != nil {
			st.Err = err
			emit(st, "done")
			continue
		}
		emit(st, "finished")
	}
}
