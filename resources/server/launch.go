package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/agent-dev/agent/internal/state"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
)

// launchPlan is what one launch of a new generation keeps in its records besides s's
// identity and the process facts.
type launchPlan struct {
	// held is the record kept while the launch is pending (nil: none; the record is
	// deleted if nothing starts).
	held *serverRecord
	// prevGen is the generation the new one is numbered after.
	prevGen int
	// keep sets what the new generation's records carry over (a migration's retiring
	// generation, a change's way back, a revert's rejected change): on the intent and on
	// the launched record alike.
	keep func(*serverRecord)
}

// launchGeneration launches s as a new generation where lc runs it, verified (alive, log
// grown, ready, settled, smoke test): the port must be free; the intent is recorded
// before the process exists and the process once it does (an agent killed in between
// adopts it next run); the verification's outcome is recorded. The returned record is
// the launch's (PID 0 when nothing started); the error the launch's own.
func (s *Server) launchGeneration(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, p launchPlan) (*serverRecord, error) {
	procs := lc.Place.Procs(ctx)
	if s.port > 0 {
		if err := procs.PortFree(ctx, s.port, 2*time.Second); err != nil {
			if errors.Is(err, proc.ErrPortHeld) && !s.takeover {
				return nil, fmt.Errorf("not launching: %w; the holder was not started by this agent and was not touched (takeover = true lets the agent stop it)", err)
			}
			return nil, fmt.Errorf("not launching: %w", err)
		}
	}
	logDir, err := lc.Place.HostPath(ctx, s.logDir)
	if err != nil {
		return nil, err
	}
	gen, err := lifecycle.NextGeneration(logDir, s.name, p.prevGen)
	if err != nil {
		return nil, err
	}
	marker := fmt.Sprintf("AGENT_SERVER=%s#%d@%d", s.addr, gen, env.Now().UnixNano())
	want := s.record()
	penv, err := launchEnv(env, s.env)
	if err != nil {
		return nil, err
	}
	spec := lifecycle.Spec{Argv: s.argv(), Env: penv, Workdir: s.workdir, User: s.user, Marker: marker, Home: s.serverHome(env)}
	want.HomeDir = spec.Home
	want.PrevStart = lastStart(p.held) // the next start is compared with it (server_phases.go)
	keep := func(r *serverRecord) {
		if p.keep != nil {
			p.keep(r)
		}
	}
	// The intent goes to state before the process exists (see serverRecord.Pending).
	intent := want
	intent.Generation, intent.Marker = gen, marker
	intent.LogPath = lifecycle.LogFile{Dir: s.logDir, Name: s.name, Generation: gen}.Path()
	keep(&intent)
	var held serverRecord
	if p.held != nil {
		held = *p.held
	}
	held.Pending = &intent
	if err := env.State.Save(&held); err != nil {
		return nil, fmt.Errorf("record the launch of generation %d before it starts: %w", gen, err)
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
			keep(&rec)
			env.Log.Info("launched", "generation", gen, "pid", x.ID.PID, "log", x.LogPath)
			return env.State.Save(&rec)
		},
	})
	if x == nil {
		// Nothing started: the intent is void.
		var serr error
		if held.Pending = nil; p.held != nil {
			serr = env.State.Save(&held)
		} else {
			serr = env.State.Delete()
		}
		return &rec, errors.Join(err, serr)
	}
	return &rec, s.recordVerification(ctx, env, lc, &rec, x, err)
}

// launchEnv is a launch's environment: the plan's, and the launch's owner, this state
// directory (state.OwnerEnv), so that no other state directory ever adopts it.
func launchEnv(env *agent.Env, planEnv map[string]string) (map[string]string, error) {
	owner, err := env.State.OwnerMark()
	if err != nil {
		return nil, fmt.Errorf("the state directory's identity: %w", err)
	}
	out := maps.Clone(planEnv)
	if out == nil {
		out = map[string]string{}
	}
	out[state.OwnerEnv] = owner
	return out, nil
}
