package server

import (
	"context"
	"fmt"
	"syscall"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/state"
)

// A server in a container that migrates (container_migrate.go) follows its container's
// live instance: the container's record names it (the plan's name, or its pair). The
// place is part of the server's identity, so a new live instance means a launch there;
// when the old place is the instance that retires, the launch is make before break: the
// running generation is not stopped first but kept in the record as Retiring, serving
// until the new generation is verified (ready, settled, smoke-tested) and every
// resource that depends on the server verified too. Finish (agent.Finisher) then stops
// it with the same proof as a relaunch's stop.

// liveView is the server as it runs now: in its container's live instance. The view
// shares everything else with s.
func (s *Server) liveView(env *agent.Env) *Server {
	if s.container == "" {
		return s
	}
	live, retiring := s.host.LiveInstance(env, s.container)
	if live == s.container && retiring == "" {
		return s
	}
	v := *s
	v.container, v.place = live, lifecycle.IncusPlace(live)
	if retiring != "" {
		v.retiringPlace = lifecycle.IncusPlace(retiring)
	}
	return &v
}

// migrating reports whether a change of place from rec's is a migration of the
// container: rec runs in the instance that retires.
func (s *Server) migrating(rec *serverRecord) bool {
	return s.retiringPlace != "" && rec.Place == s.retiringPlace && rec.Place != s.place
}

// markMigration turns the place change of a migrating server into what it is: make
// before break, for the rollout its reason.
func (s *Server) markMigration(d *agent.Diff, rec *serverRecord) {
	for i, c := range d.Changes {
		if c.Attr == "place" {
			c.Note = fmt.Sprintf("make before break: a new generation in %s, verified; generation %d (pid %d) in %s stopped after, verified",
				s.place, rec.Generation, rec.PID, rec.Place)
			d.Changes[i] = c.Because(agent.Restarts, agent.ReasonMigrate)
		}
	}
}

// retiringOf is the generation a launch keeps running: the previous one when this
// launch is a migration's, else what the previous record already kept.
func retiringOf(det *serverDetail) *serverRecord {
	if det.prev == nil {
		return nil
	}
	if det.migrate {
		r := *det.prev
		r.Pending, r.Retiring = nil, nil
		return &r
	}
	return det.prev.Retiring
}

var _ agent.Finisher = (*Server)(nil)

// unfinished names the break work a migration left by the record rec: its retiring
// generation, "" when none.
func unfinished(rec *serverRecord) string {
	r := rec.Retiring
	if r == nil || r.PID <= 0 {
		return ""
	}
	return fmt.Sprintf("retiring generation %d (pid %d) in %s stopped, verified (generation %d serves in %s)", r.Generation, r.PID, r.Place, rec.Generation, rec.Place)
}

// Finish stops the retiring generation where it runs, verified as a relaunch's stop
// is (the process group gone, the port free), and forgets it.
func (s *Server) Finish(ctx context.Context, env *agent.Env) error {
	var rec serverRecord
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	if rec.Retiring == nil {
		return nil
	}
	if err := s.stopRetiring(ctx, env, rec.Retiring); err != nil {
		return err
	}
	rec.Retiring = nil
	return env.State.Save(&rec)
}

// stopRetiring stops r, a migration's retiring generation, with the stop block it was
// launched with.
func (s *Server) stopRetiring(ctx context.Context, env *agent.Env, r *serverRecord) error {
	if r.PID <= 0 {
		return nil
	}
	lc, err := s.liveView(env).lifecycleAt(ctx, r.Place)
	if err != nil {
		return err
	}
	sig, timeout := syscall.Signal(r.StopSignal), r.StopTimeout
	if sig == 0 {
		sig = s.stopSignal
	}
	if timeout <= 0 {
		timeout = s.stopTimeout
	}
	rep, err := lc.StopIn(ctx, r.PIDNS, r.target(), sig, timeout, r.Port)
	if err != nil {
		return fmt.Errorf("stop retiring generation %d (pid %d) in %s: %w", r.Generation, r.PID, r.Place, err)
	}
	env.Log.Info("stopped the retiring generation", "generation", r.Generation, "pid", r.PID, "place", r.Place, "result", lifecycle.Summary(rep))
	return nil
}

// ServerPeers answers the other kinds' questions of the server records.
type ServerPeers struct{}

// RunIn implements resources.Servers from the server records.
func (ServerPeers) RunIn(env *agent.Env, instance string) bool {
	found := false
	ok := state.EachRecord(env.State.Others(), "server", func(_ string, rec serverRecord) bool {
		found = rec.StoppedAt.IsZero() && (rec.PID > 0 || rec.Pending != nil) && rec.Place == lifecycle.IncusPlace(instance)
		return !found
	})
	return found || !ok
}
