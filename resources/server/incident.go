package server

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// Status in an incident (issue 13, 7): what an operator reads while something is wrong
// must say what the agent did and what holds the port, never guess from a probe.

// markStopping records that an apply is stopping rec's generation (on) or no longer is
// (off, after a failed stop), so that a concurrent status never calls it ready. The
// record is best effort: a failed save does not stop the stop.
func (s *Server) markStopping(env *agent.Env, rec *serverRecord, on bool) {
	rec.StoppingSince = time.Time{}
	if on {
		rec.StoppingSince = env.Now()
	}
	if rec.PID != 0 {
		_ = env.State.Save(rec)
	}
}

// statusInFlight is what status says of a live generation an apply is working on: one
// being stopped, or one launched and not yet verified (an apply waiting for it, or an
// agent that died before verifying it). Either is a problem, never "ready".
func (s *Server) statusInFlight(field func(agent.Field), rec *serverRecord) []string {
	switch {
	case !rec.StoppingSince.IsZero():
		field(agent.TimeField("stopping_since", "stopping", rec.StoppingSince).WithText(fmt.Sprintf("since %s: an apply is stopping generation %d", rec.StoppingSince.Format("2006-01-02 15:04:05"), rec.Generation)))
		return []string{fmt.Sprintf("being stopped by an apply (since %s)", rec.StoppingSince.Format(time.TimeOnly))}
	case !rec.verified():
		field(agent.BoolField("verified", "verification", false).WithText("launched, not verified yet (ready, ready.settle, smoke test): an apply in flight, or the next one, verifies it"))
		return []string{"launched, not verified yet"}
	}
	return nil
}

// statusIncident adds to the status of a generation that is gone: why the agent stopped
// it, with the lines it quoted from its log, and who holds the port now (after PID
// reuse, or a foreign server started in its place).
func (s *Server) statusIncident(ctx context.Context, field func(agent.Field), st *agent.Status, rec *serverRecord, procs lifecycle.Procs) {
	if f := rec.Failure; f != nil {
		// Only a stop the agent made says so: a generation that died (an OOM) exited by
		// itself, whatever leftovers the agent then stopped.
		how := "was stopped by the agent"
		if f.Exited {
			how = "exited by itself; the agent found it gone"
		}
		st.Summary = fmt.Sprintf("generation %d %s at %s: %s", rec.Generation, how, f.At.Format("2006-01-02 15:04:05"), f.Reason)
		if i := strings.Index(f.Verdict, ":"); i > 0 {
			st.Summary += "; " + f.Verdict[:i] // the dead branch shows the whole verdict
		}
		if len(f.Tail) > 0 {
			field(agent.TextField("log_tail", "log tail", strings.Join(f.Tail, "\n")))
		}
	}
	if s.port <= 0 {
		return
	}
	holder, err := s.portHolder(ctx, procs, rec)
	if err != nil || holder == nil {
		return
	}
	desc := describeProc(ctx, procs, holder.PID)
	field(agent.TextField("port_holder", "port", fmt.Sprintf("%d is held by %s, not by this server", s.port, desc)))
	st.Summary += fmt.Sprintf("; port %d is held by %s", s.port, desc)
}
