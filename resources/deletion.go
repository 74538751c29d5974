package resources

import (
	"context"

	"github.com/agent-dev/agent/agent"
)

// Deletion is how a resource is deleted rather than kept, embedded in the kinds that
// delete (server, container, download): the plan's ensure = "absent", agent destroy, or
// an orphan (a record whose block left the plan). A server's is the same verified stop
// as a relaunch's: the group gone, the PID with its start time gone, the GPU memory
// released, the port free.
type Deletion struct {
	Delete bool
	Why    agent.Reason // ensure_absent, destroy or orphan
	// Orphan: built from the record alone; the record is removed once the deletion is
	// verified (there is no block left to show its history). Otherwise the record stays,
	// marked stopped, so status says when and by whom.
	Orphan bool
}

// Absent reports whether the plan says ensure = "absent".
func (d Deletion) Absent() bool { return d.Delete && d.Why == agent.ReasonEnsureAbsent }

// LeftAlone is an orphan whose record cannot say what to delete (written by an older
// agent): observed as a no-op with a warning that names the fix, so that one old record
// never fails every plan.
type LeftAlone struct{ Why string }

// Check observes nothing: the warning is all there is.
func (l LeftAlone) Check(context.Context, *agent.Env) (*agent.Diff, error) {
	return &agent.Diff{Action: agent.NoOp, Warnings: []string{l.Why}}, nil
}

// Apply does nothing.
func (l LeftAlone) Apply(context.Context, *agent.Env, *agent.Diff) error { return nil }
