package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Every change keeps its way back (issue 35). An orphan that a still-planned resource's
// current record depends on (deps.json: the server's generation was launched from
// download.m1's weights) is what that resource's last good generation needs to run
// again: deleting it first, as orphans otherwise are, would leave a failed model switch
// nothing to roll back to. Such an orphan is deleted only after every such dependent
// converged on its new inputs and was verified, as Terraform orders a destroy after the
// update of whatever depended on it:
//
//   - apply deletes it after the walk, once each dependent's step succeeded in this
//     apply (verified by a fresh Check) and holds no rejected change (Diff.Held); else
//     it is kept, with why, and a later apply deletes it;
//   - the loop waits for the dependents as for dependencies (Engine.Deps), and a
//     dependent that holds a rejected change (serving its rolled-back generation) keeps
//     it waiting;
//   - the dependencies a resource's current record needs are kept in deps.json until it
//     is verified on its new inputs: a step that failed or holds a rejected change keeps
//     its old dependencies beside the new ones (saveDeps).
//
// An orphan that another waiting orphan needs waits as long as that one.

// waitingOrphans maps each orphan that a planned resource's recorded dependencies name,
// directly or through other orphans, to those planned resources (sorted). order is the
// orphans' delete order (dependents first); deps the recorded dependencies.
func (e *Engine) waitingOrphans(order []string, deps map[string][]string) map[string][]string {
	after := map[string][]string{}
	renamed := e.movedFromPairs()
	for p, ds := range deps {
		if to, ok := renamed[p]; ok {
			p = to // a moved block's record, not renamed in deps.json yet
		}
		if e.plan.Resource(p) == nil {
			continue
		}
		for _, d := range ds {
			if slices.Contains(order, d) && !slices.Contains(after[d], p) {
				after[d] = append(after[d], p)
			}
		}
	}
	for i, o := range order {
		for _, dependent := range order[:i] {
			if !slices.Contains(deps[dependent], o) {
				continue
			}
			for _, p := range after[dependent] {
				if !slices.Contains(after[o], p) {
					after[o] = append(after[o], p)
				}
			}
		}
	}
	for o := range after {
		slices.Sort(after[o])
	}
	return after
}

// deleteAfter is Apply's delete of the orphans that waited for the plan's resources,
// after the walk, dependents first: each one whose dependents all verified is deleted
// as any orphan (step); the others are kept, and their step says why.
func (e *Engine) deleteAfter(ctx context.Context, byAddr map[string]*Step, step func(context.Context, string) error) {
	for _, addr := range e.orphans {
		if len(e.after[addr]) == 0 {
			continue
		}
		st := byAddr[addr]
		if ctx.Err() != nil {
			st.Err = ctx.Err()
			continue
		}
		if why := e.stillNeeded(ctx, addr, byAddr); why != "" {
			st.Diff = &Diff{Action: NoOp, Warnings: []string{why}}
			e.log.Warn("orphan kept: what serves still needs it", "resource", addr, "why", why)
			continue
		}
		step(ctx, addr)
	}
}

// stillNeeded says why the orphan addr must not be deleted now ("" when it may be): a
// planned resource whose current record depends on it did not converge on its new inputs
// in this apply, holds a rejected change, or (outside a --target) does not match the plan.
func (e *Engine) stillNeeded(ctx context.Context, addr string, byAddr map[string]*Step) string {
	for _, p := range e.after[addr] {
		st := byAddr[p]
		var held, failed string
		switch {
		case st == nil && e.resources[p] == nil:
			failed = "not part of this run"
		case st == nil:
			// Not part of this apply (--target): deleted only if it already matches.
			d, err := e.check(ctx, p)
			switch {
			case err != nil:
				failed = firstLine(errLineOf(p, err))
			case d.Action != NoOp:
				failed = fmt.Sprintf("not part of this apply, and it still needs a %s", d.Action)
			default:
				held = d.Held
			}
		case st.Err != nil:
			failed = firstLine(errLineOf(p, st.Err))
		case st.Diff != nil:
			held = st.Diff.Held
		}
		switch {
		case failed != "":
			return fmt.Sprintf("kept: %s's last good generation was launched from it, and %s was not verified on its new inputs (%s); a later apply deletes it once %s is verified",
				p, p, failed, p)
		case held != "":
			return fmt.Sprintf("kept: %s still serves its last good generation, launched from it (%s)", p, firstLine(held))
		}
	}
	return ""
}

// DeletedAfterText is how people read Step.DeletedAfter: "deleted after server.s is
// verified".
func DeletedAfterText(after []string) string {
	verb := "is"
	if len(after) > 1 {
		verb = "are"
	}
	names := strings.Join(after, ", ")
	if n := len(after); n > 1 {
		names = strings.Join(after[:n-1], ", ") + " and " + after[n-1]
	}
	return fmt.Sprintf("deleted after %s %s verified", names, verb)
}

// keptDeps is what a planned resource's record of dependencies becomes after a step: its
// plan's dependencies once it verified on its new inputs, else those and the ones its
// current record was launched with (its last good generation may still need them).
func keptDeps(st *Step, old, now []string) []string {
	if st.Err == nil && (st.Diff == nil || st.Diff.Held == "") {
		return now
	}
	out := slices.Clone(now)
	for _, d := range old {
		if !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func errLineOf(addr string, err error) string { return strings.TrimPrefix(err.Error(), addr+": ") }

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSuffix(strings.TrimSpace(line), ":")
}
