package server

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

var _ agent.Ensurer = (*Server)(nil)

// AsAbsent is the server as agent destroy deletes it.
func (s *Server) AsAbsent() agent.Resource {
	return &Server{addr: s.addr, name: s.name, host: s.host, container: s.container, place: s.place, port: s.port, incus: s.incus,
		stopSignal: s.stopSignal, stopTimeout: s.stopTimeout, ready: lifecycle.Ready{Timeout: time.Second}, logDir: s.logDir,
		Deletion: resources.Deletion{Delete: true, Why: agent.ReasonDestroy}}
}

func (s *Server) bindEnsure(r *plans.Resource, ensure *string, bad func(hcl.Range, string, string)) {
	switch e := resources.Deref(ensure); e {
	case "", "present":
	case "absent":
		s.Deletion = resources.Deletion{Delete: true, Why: agent.ReasonEnsureAbsent}
	default:
		bad(r.Range("ensure"), "Invalid ensure", fmt.Sprintf("ensure is \"present\" or \"absent\", not %q.", e))
	}
}

// orphanServer is the deleter of a server whose block left the plan, from its record
// alone: where it runs, its process, its port, and the stop block it was launched with.
// A record already stopped for good has nothing left to delete (nil).
func orphanServer(h resources.Machine, addr string, st *state.Scoped, a *plans.AgentSettings) (agent.Resource, error) {
	var rec serverRecord
	has, err := st.Load(&rec)
	if err != nil {
		return nil, err
	}
	if !has || !rec.StoppedAt.IsZero() {
		return nil, nil
	}
	_, name, _ := strings.Cut(addr, ".")
	s := &Server{addr: addr, name: name, host: h, place: rec.Place, port: rec.Port, incus: resources.NewIncus(a),
		stopSignal: syscall.SIGTERM, stopTimeout: DefaultStopTimeout, ready: lifecycle.Ready{Timeout: time.Second},
		Deletion: resources.Deletion{Delete: true, Why: agent.ReasonOrphan, Orphan: true}}
	if c, ok := strings.CutPrefix(rec.Place, lifecycle.IncusPlace("")); ok {
		s.container = c
	}
	if rec.StopSignal != 0 {
		s.stopSignal = syscall.Signal(rec.StopSignal)
	}
	if rec.StopTimeout > 0 {
		s.stopTimeout = rec.StopTimeout
	}
	return s, nil
}

// checkAbsent plans the verified stop of what the record names. Nothing recorded, or a
// record stopped for good, is a no-op. A recorded process already dead is still a
// delete: the stop proves that nothing of its group holds the port or GPU memory.
func (s *Server) checkAbsent(ctx context.Context, env *agent.Env) (d *agent.Diff, err error) {
	var rec serverRecord
	has, err := env.State.Load(&rec)
	if err != nil {
		return nil, err
	}
	if has && rec.Pending != nil {
		var found *agent.RecordUpdate
		if has, found, err = s.recoverPending(&rec); err != nil {
			return nil, err
		}
		defer func() {
			if d != nil {
				d.Record = found
			}
		}()
	}
	if !has || !rec.StoppedAt.IsZero() {
		return agent.NoChange(), nil
	}
	alive, err := s.recordProcs(ctx, &rec).Alive(ctx, rec.id())
	if err != nil {
		return nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
	}
	what := fmt.Sprintf("pid %d, generation %d", rec.PID, rec.Generation)
	if !alive {
		what = fmt.Sprintf("pid %d (generation %d) is gone; what is left of its group is stopped", rec.PID, rec.Generation)
	}
	if rec.Adopted {
		what += " (adopted)"
	}
	d = &agent.Diff{Detail: &serverDetail{prev: &rec, stop: true}}
	d.Add(agent.Removed("process", agent.Raw(what)).Because(agent.Deletes, s.Why))
	if rec.Port > 0 {
		d.Add(agent.Removed("port", rec.Port).Because(agent.Deletes, s.Why))
	}
	return d.Derive(), nil
}

// applyAbsent stops the recorded launch, verified, where it runs, then marks the record
// stopped (or removes an orphan's).
func (s *Server) applyAbsent(ctx context.Context, env *agent.Env, det *serverDetail) error {
	rec := det.prev
	if rec == nil {
		return nil
	}
	if r := rec.Retiring; r != nil { // a migration's old generation goes too, first
		if err := s.stopRetiring(ctx, env, r); err != nil {
			return err
		}
		rec.Retiring = nil
		if err := env.State.Save(rec); err != nil {
			return err
		}
	}
	lc, err := s.lifecycleAt(ctx, rec.Place)
	if err != nil {
		return err
	}
	rep, err := lc.StopIn(ctx, rec.PIDNS, rec.target(), s.stopSignal, s.stopTimeout, rec.Port)
	if err != nil {
		return fmt.Errorf("stop generation %d (pid %d): %w", rec.Generation, rec.PID, err)
	}
	env.Log.Info("stopped for good", "generation", rec.Generation, "pid", rec.PID, "reason", string(s.Why), "result", lifecycle.Summary(rep))
	if s.Orphan {
		return env.State.Delete()
	}
	rec.StoppedAt, rec.StoppedBy = env.Now().UTC(), "agent ("+s.Why.Describe()+")"
	rec.UnreadySince, rec.Pending = time.Time{}, nil
	return env.State.Save(rec)
}

// absentStatus is the status of a server the agent stopped for good, or that the plan
// wants absent.
func (s *Server) absentStatus(ctx context.Context, env *agent.Env, has bool, rec *serverRecord) (*agent.Status, error) {
	st := &agent.Status{Healthy: s.Delete, Metrics: map[string]float64{"up": 0, "ready": 0, "generation": float64(rec.Generation)}}
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	switch {
	case !has:
		st.Summary = "absent: nothing recorded, nothing launched by this agent"
		return st, nil
	case rec.StoppedAt.IsZero():
		alive, err := s.recordProcs(ctx, rec).Alive(ctx, rec.id())
		if err != nil {
			return nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
		}
		st.Healthy = false
		if alive {
			st.Metrics["up"] = 1
			st.Summary = fmt.Sprintf("running (pid %d, generation %d), but the plan says ensure = \"absent\": agent apply stops it", rec.PID, rec.Generation)
		} else {
			st.Summary = fmt.Sprintf("pid %d (generation %d) is gone; agent apply verifies the stop", rec.PID, rec.Generation)
		}
		field(agent.NumberField("pid", "pid", rec.PID))
		field(agent.NumberField("generation", "generation", rec.Generation))
		return st, nil
	}
	by := rec.StoppedBy
	if by == "" {
		by = "agent"
	}
	st.Summary = fmt.Sprintf("stopped at %s by the %s; generation %d was the last", rec.StoppedAt.Local().Format("2006-01-02 15:04:05"), by, rec.Generation)
	if !s.Delete {
		st.Summary += "; agent apply launches it again"
	}
	field(agent.AgeField("stopped_at", "stopped", rec.StoppedAt.Local(), env.Now()))
	field(agent.NumberField("last_pid", "last pid", rec.PID))
	field(agent.NumberField("generation", "generation", rec.Generation))
	if rec.LogPath != "" {
		field(agent.TextField("log", "log", rec.LogPath))
	}
	return st, nil
}
