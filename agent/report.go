package agent

import (
	"errors"
	"time"

	"github.com/agent-dev/agent/internal/dag"
)

// Step is the outcome of one resource in a plan, apply or status run.
type Step struct {
	Addr string
	// Diff is what Check found (before acting, for apply).
	Diff *Diff
	// Err is the failure of this step, or a *dag.SkippedError when a dependency failed.
	Err error
	// Applied is true when Apply ran and its result was verified by a fresh Check.
	Applied bool
	// Status is the live status (status runs only).
	Status   *Status
	Duration time.Duration
	// Orphan: the resource is recorded in state but its block is gone from the plan.
	Orphan bool
	// MovedFrom is the old address of a resource a moved block renamed.
	MovedFrom string
	// DeletedAfter, for an orphan, lists the planned resources whose current record
	// depends on it (what serves now was launched from it): it is deleted only after
	// they converged on their new inputs and were verified, so that their way back
	// stays (agent/wayback.go).
	DeletedAfter []string
	// Unfinished is the break work the step's last observation reported (Diff.Unfinished
	// of the verifying Check when it applied): what Finish does once the resource's
	// dependents verified.
	Unfinished string
	// Finished describes the break work this apply finished after the resource's
	// dependents verified (Finisher): a migrated container's old instance deleted.
	Finished string
	// Fingerprint is what the plan's observation was decided from (plan runs with
	// Options.FingerprintKey only): what a saved plan is bound to.
	Fingerprint *Fingerprint
}

// Skipped reports whether the step did not run because a dependency failed, or because
// its rollout group stopped at a failed member or is held at its limit by unavailable
// ones, and which resource is the cause.
func (s *Step) Skipped() (cause string, ok bool) {
	var sk *dag.SkippedError
	if errors.As(s.Err, &sk) {
		return sk.Cause, true
	}
	var re *RolloutError
	if errors.As(s.Err, &re) {
		if re.Stopped {
			return re.Cause, true
		}
		if len(re.blockers) > 0 {
			return re.blockers[0].addr, true
		}
	}
	return "", false
}

// Report is the result of a run, steps in dependency order.
type Report struct {
	Steps []*Step
	// Rollouts summarise the plan's rollout groups (plan runs only).
	Rollouts []RolloutSummary
}

// Summary counts the actions of the report's diffs.
func (r *Report) Summary() Summary {
	var s Summary
	for _, st := range r.Steps {
		if st.Diff != nil {
			s.count(st.Diff.Action)
		}
	}
	return s
}

// Failed reports whether any step failed or was skipped.
func (r *Report) Failed() bool {
	for _, st := range r.Steps {
		if st.Err != nil {
			return true
		}
	}
	return false
}

// Changes reports whether any step's diff is not a no-op.
func (r *Report) Changes() bool { return r.Summary().Total() > 0 }
