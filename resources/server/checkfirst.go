package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/state"
)

// checkBeforeBreak checks, before a relaunch stops anything, what would make the new
// generation fail to start where it runs (lifecycle.Preflight: the command, the working
// directory, the log directory and the new log path, with room to spare) or fail to be
// recorded (the state directory, with room to spare), so that a typo in command, a log
// directory the agent cannot write or a directory at the log path never takes a healthy
// server down (issue 13, 4). Whether the model fits the GPUs is Check's preflight (it
// counts the generation being replaced as freed, and preflight = "enforce" refuses
// there, before this).
func (s *Server) checkBeforeBreak(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, det *serverDetail) error {
	prevGen := det.lastGen
	if det.prev != nil {
		prevGen = det.prev.Generation
	}
	logDir, err := lc.Place.HostPath(ctx, s.logDir)
	if err != nil {
		return err
	}
	gen, err := lifecycle.NextGeneration(logDir, s.name, prevGen)
	if err != nil {
		return err
	}
	running := false
	if det.stop && det.prev != nil {
		alive, aerr := s.recordProcs(ctx, det.prev).Alive(ctx, det.prev.id())
		running = aerr == nil && alive
	}
	spec := lifecycle.Spec{Argv: s.argv(), Env: s.env, Workdir: s.workdir, User: s.user}
	err = lc.Preflight(ctx, spec, lifecycle.LogFile{Dir: s.logDir, Name: s.name, Generation: gen})
	if err == nil && env.State != nil {
		// The next launch must be recorded (its PID, start time, generation) before
		// anything is stopped: a full state disk must never leave the host serving
		// nothing (issue 27).
		err = env.State.CheckRoom(state.MinFree)
	}
	if err == nil && running && s.preflightMode != "off" {
		// A running server is not stopped for a launch whose model would not fit even
		// once it is gone (its memory counts as freed): with preflight = "warn" a
		// first launch only warns, but nothing serving is broken on that bet.
		if msg, fits := s.preflight(ctx, det.prev); !fits {
			err = fmt.Errorf("%w: the model would not fit the GPUs: %s (preflight = \"off\" skips this check)", lifecycle.ErrPreflight, msg)
		}
	}
	if err == nil {
		return nil
	}
	if running {
		return fmt.Errorf("not stopping generation %d (pid %d), which keeps running: generation %d could not start: %w", det.prev.Generation, det.prev.PID, gen, err)
	}
	return fmt.Errorf("not launching generation %d: %w", gen, err)
}

// afterBreak says, in the error of an apply that stopped the previous generation and
// then failed to start or verify the new one, that the previous one was stopped: nothing
// of this server serves until the error is fixed. A smoke test failure leaves the new
// generation serving, and says so itself.
func (det *serverDetail) afterBreak(err error) error {
	var se *lifecycle.SmokeError
	var re *revertedError // it says itself what serves
	if err == nil || !det.stopped || det.prev == nil || errors.As(err, &se) || errors.As(err, &re) {
		return err
	}
	return fmt.Errorf("generation %d (pid %d) was stopped, verified, then: %w", det.prev.Generation, det.prev.PID, err)
}
