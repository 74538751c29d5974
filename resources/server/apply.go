package server

import (
	"context"
	"fmt"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// Apply adopts, or stops what must stop (verified) and launches a new generation
// (verified: alive, log grown, ready, smoke test).
func (s *Server) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) (err error) {
	det, ok := d.Detail.(*serverDetail)
	if !ok {
		return fmt.Errorf("internal error: diff detail is %T", d.Detail)
	}
	if s.Delete {
		return s.applyAbsent(ctx, env, det)
	}
	if det.adopt {
		return nil // recorded by the engine, from the diff: nothing on the host changes
	}
	s = s.liveView(env)
	lc, err := s.lifecycle(ctx)
	if err != nil {
		return err // before anything is stopped
	}
	if det.verify {
		err := s.verifyRecorded(ctx, env, lc, det.prev)
		if err != nil && revertsOn(err) && s.midRevert(det.prev) {
			return s.revert(ctx, env, lc, det.prev, err)
		}
		return err
	}
	if det.revert {
		return s.revert(ctx, env, lc, det.prev, nil)
	}
	if det.smoke {
		return s.rerunSmoke(ctx, env, lc, det.prev)
	}
	if det.again {
		g, err := s.asLaunched(det.prev)
		if err != nil {
			return fmt.Errorf("relaunch the rolled-back generation %d's command line: %w", det.prev.Generation, err)
		}
		s = g
	}
	if err := s.checkBeforeBreak(ctx, env, lc, det); err != nil {
		return err // before anything is stopped
	}
	defer func() { err = det.afterBreak(err) }()
	prevGen := det.lastGen
	if det.prev != nil {
		prevGen = det.prev.Generation
	}
	warmed := s.warmBeforeStop(ctx, env, lc, d) // the old generation still serves
	if err := s.stopInTheWay(ctx, env, lc, det); err != nil {
		return err
	}
	if det.reset != nil {
		s.resetGPU(ctx, env, det.reset)
	}
	beside := func(bool) *warmRecord { return warmed }
	if warmed == nil {
		beside = s.warmBeside(ctx, env, lc)
	}
	retiring := retiringOf(det) // kept serving until Finish (a migration), in every record from here
	lastGood := s.lastGoodFor(det.prev)
	rec, err := s.launchGeneration(ctx, env, lc, launchPlan{held: det.prev, prevGen: prevGen, keep: func(r *serverRecord) {
		r.Retiring, r.LastGood, r.Warm = retiring, lastGood, warmed
		if det.prev != nil {
			r.Reverts = det.prev.Reverts
		}
		carryWedge(r, det.prev)
		carryGPUFault(r, det.prev, det.reset)
		if det.again {
			r.Rejected, r.RevertOf = det.prev.Rejected, det.prev.RevertOf
		}
	}})
	if w := beside(err == nil); w != nil && warmed == nil && err == nil && rec != nil && rec.PID != 0 {
		rec.Warm = w
		if serr := env.State.Save(rec); serr != nil {
			env.Log.Warn("the warm-up's figures were not recorded", "error", serr)
		}
	}
	if err != nil && lastGood != nil && rec != nil && rec.PID != 0 && revertsOn(err) {
		return s.revert(ctx, env, lc, rec, err)
	}
	return err
}

// stopInTheWay stops, verified, what stands in the launch's way: the previous
// generation where it runs (its recorded place, which the plan may have changed), and a
// foreign port holder when takeover = true.
func (s *Server) stopInTheWay(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, det *serverDetail) error {
	if det.stop && det.prev != nil {
		plc, err := s.lifecycleAt(ctx, det.prev.Place)
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
