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
// The engine knows no kind: what "unfinished" means is the resource's own record.
type Finisher interface {
	// Unfinished describes the break work left ("retiring instance qwen on m2: stopped
	// and deleted once its dependents verify"), or "" when there is none. It reads the
	// resource's own record only: it never touches the host.
	Unfinished(env *Env) string
	// Finish carries the break work out and verifies it (a process stopped with proof,
	// an instance gone from the API), recording each step first so that an agent killed
	// midway finishes on its next run.
	Finish(ctx context.Context, env *Env) error
}

// Unfinished describes addr's break work left by an earlier apply ("" when none, or when
// addr is not a Finisher).
func (e *Engine) Unfinished(addr string) string {
	f, ok := e.resources[addr].(Finisher)
	if !ok || e.isOrphan(addr) {
		return ""
	}
	return f.Unfinished(e.env(addr))
}

// PlanDependents returns every resource of the whole plan that depends on addr, directly
// or not: what must have verified before addr's break work is done. It ignores
// --target, on purpose: a dependent left out of the run has not verified in it.
func (e *Engine) PlanDependents(addr string) []string { return e.full.Dependents(addr) }

// Finish runs addr's Finish under its step timeout and panic guard; nil when addr has
// nothing to finish.
func (e *Engine) Finish(ctx context.Context, addr string) error {
	f, ok := e.resources[addr].(Finisher)
	if !ok {
		return nil
	}
	what := f.Unfinished(e.env(addr))
	if what == "" {
		return nil
	}
	e.log.Info("finishing", "resource", addr, "work", what)
	err := e.guard(ctx, addr, "finish", func(ctx context.Context) error {
		return f.Finish(ctx, e.env(addr))
	})
	if err != nil {
		return withAddr(addr, "finish", err)
	}
	if left := f.Unfinished(e.env(addr)); left != "" {
		return fmt.Errorf("%s: finish: still unfinished after finishing: %s", addr, left)
	}
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
		if st == nil || st.Err != nil || ctx.Err() != nil {
			continue
		}
		what := e.Unfinished(addr)
		if what == "" {
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
				st.Diff.Warnings = append(st.Diff.Warnings, fmt.Sprintf("%s; left until %v verify in an apply", what, waiting))
			}
			e.log.Warn("not finished: dependents have not verified", "resource", addr, "work", what, "waiting_for", waiting)
			continue
		}
		if err := e.Finish(ctx, addr); err != nil {
			st.Err = err
			emit(st, "done")
			continue
		}
		st.Finished = what
		emit(st, "finished")
	}
}
