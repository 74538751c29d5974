package resources

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
)

// Apply adopts, or stops what must stop (verified) and launches a new generation
// (verified: alive, log grown, ready, smoke test).
func (s *Server) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) (err error) {
	det, ok := d.Detail.(*serverDetail)
	if !ok {
		return fmt.Errorf("internal error: diff detail is %T", d.Detail)
	}
	if s.absent {
		return s.applyAbsent(ctx, env, det)
	}
	if det.adopt {
		return nil // recorded by the engine, from the diff: nothing on the host changes
	}
	s = s.liveView(env)
	lc, err := s.lifecycle(ctx, env)
	if err != nil {
		return err // before anything is stopped
	}
	if det.verify {
		return s.verifyRecorded(ctx, env, lc, det.prev)
	}
	if err := s.checkBeforeBreak(ctx, env, lc, det); err != nil {
		return err // before anything is stopped
	}
	defer func() { err = det.afterBreak(err) }()
	prevGen := det.lastGen
	if det.prev != nil {
		prevGen = det.prev.Generation
	}
	if err := s.stopInTheWay(ctx, env, lc, det); err != nil {
		return err
	}
	procs := lc.Place.Procs(ctx)
	if s.port > 0 {
		if err := procs.PortFree(ctx, s.port, 2*time.Second); err != nil {
			if errors.Is(err, proc.ErrPortHeld) && !s.takeover {
				return fmt.Errorf("not launching: %w; the holder was not started by this agent and was not touched (takeover = true lets the agent stop it)", err)
			}
			return fmt.Errorf("not launching: %w", err)
		}
	}
	logDir, err := lc.Place.HostPath(ctx, s.logDir)
	if err != nil {
		return err
	}
	gen, err := lifecycle.NextGeneration(logDir, s.name, prevGen)
	if err != nil {
		return err
	}
	marker := fmt.Sprintf("AGENT_SERVER=%s#%d@%d", s.addr, gen, env.Now().UnixNano())
	want := s.record()
	spec := lifecycle.Spec{Argv: s.argv(), Env: s.env, Workdir: s.workdir, User: s.user, Marker: marker, Home: s.serverHome(env)}
	// The intent goes to state before the process exists (see serverRecord.Pending).
	intent := want
	intent.Generation, intent.Marker = gen, marker
	intent.LogPath = lifecycle.LogFile{Dir: s.logDir, Name: s.name, Generation: gen}.Path()
	retiring := retiringOf(det) // kept serving until Finish (a migration), in every record from here
	intent.Retiring = retiring
	var held serverRecord
	if det.prev != nil {
		held = *det.prev
	}
	held.Pending = &intent
	if err := env.State.Save(&held); err != nil {
		return fmt.Errorf("record the launch of generation %d before it starts: %w", gen, err)
	}
	var rec serverRecord
	x, err := lc.Launch(ctx, lifecycle.LaunchOptions{
		Name: s.name, LogDir: s.logDir, KeepLogs: s.keepLogs, Generation: gen, Spec: spec, Port: s.port,
		Ready: s.ready, Smoke: s.smoke,
		OnStarted: func(x *lifecycle.Launched) error {
			rec = want
			rec.Generation, rec.PID, rec.StartTicks, rec.PGID, rec.SID = gen, x.ID.PID, x.ID.StartTicks, x.PGID, x.SID
			rec.PIDNS = x.NS
			rec.Marker, rec.LogPath, rec.LaunchedAt = marker, x.LogPath, x.LaunchedAt
			rec.Retiring = retiring
			env.Log.Info("launched", "generation", gen, "pid", x.ID.PID, "log", x.LogPath)
			return env.State.Save(&rec)
		},
	})
	if x == nil {
		// Nothing started: the intent is void.
		var serr error
		if held.Pending = nil; det.prev != nil {
			serr = env.State.Save(&held)
		} else {
			serr = env.State.Delete()
		}
		return errors.Join(err, serr)
	}
	return s.recordVerification(env, &rec, x, err)
}

// stopInTheWay stops, verified, what stands in the launch's way: the previous
// generation where it runs (its recorded place, which the plan may have changed), and a
// foreign port holder when takeover = true.
func (s *Server) stopInTheWay(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, det *serverDetail) error {
	if det.stop && det.prev != nil {
		plc, err := s.lifecycleAt(ctx, env, det.prev.Place)
		if det.prev.Place == "" || det.prev.Place == s.place {
			plc, err = lc, nil
		}
		if err != nil {
			return err
		}
		port := det.prev.Port
		if port == 0 {
			port = s.port
		}
		if det.takeover != nil {
			// A foreign process holds the port, not the previous generation (dead, or
			// gone from it): this stop cannot free it; the takeover's stop below does,
			// verified, and the port is checked again before the launch.
			port = 0
		}
		s.markStopping(env, det.prev, true)
		rep, err := plc.StopIn(ctx, det.prev.PIDNS, det.prev.target(), s.stopSignal, s.stopTimeout, port)
		if err != nil {
			s.markStopping(env, det.prev, false)
			return fmt.Errorf("stop generation %d (pid %d): %w", det.prev.Generation, det.prev.PID, err)
		}
		env.Log.Info("stopped", "generation", det.prev.Generation, "pid", det.prev.PID, "result", lifecycle.Summary(rep))
		det.stopped = !rep.LeaderGone
	}
	if det.takeover != nil {
		rep, err := lc.Stop(ctx, *det.takeover, s.stopSignal, s.stopTimeout, s.port)
		if err != nil {
			return fmt.Errorf("takeover of pid %d: %w", det.takeover.Leader.PID, err)
		}
		env.Log.Info("took over the port", "pid", det.takeover.Leader.PID, "result", lifecycle.Summary(rep))
	}
	return nil
}
