package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/agent-dev/agent/internal/proc"
)

// Stop is proc.FS.Stop inside the instance, through exec: the same set (the leader,
// its group and session while anchored by a member proved alive as itself, the
// processes carrying the marker, and every descendant of those), the same order
// (sig to the group and to each member outside it, a wait of timeout, then SIGKILL to
// the survivors and to anything forked meanwhile, looked for again each round), and
// the same proof: every identity seen gone, its PID absent, a zombie, or another start
// time. A signal reaches a PID only after the script inside has read that PID's start
// time and found the recorded one. The instance's init (PID 1) is never a member. A
// namespace that is no longer the instance's (it restarted) holds nothing: the stop
// finds nothing and says so.
func (p remoteProcs) Stop(ctx context.Context, t proc.Target, sig syscall.Signal, timeout time.Duration) (proc.Report, error) {
	start := time.Now()
	rep := proc.Report{Signal: sig}
	done := func(err error) (proc.Report, error) {
		rep.Elapsed = time.Since(start)
		return rep, err
	}
	if err := t.Check(); err != nil {
		return done(err)
	}
	stats := map[proc.Identity]proc.Stat{}
	first, err := p.snapshot(ctx, t, nil)
	if err != nil {
		return done(fmt.Errorf("stop %v in container %s: %w", t.Leader, p.r.Instance, err))
	}
	for _, s := range first {
		stats[s.Identity()] = s
		rep.Targets = append(rep.Targets, s.Identity())
	}
	if _, ok := stats[t.Leader]; !ok {
		rep.LeaderGone = true
	}
	if len(first) == 0 {
		return done(nil)
	}
	sendErr := p.send(ctx, t, first, sig)
	pending, waitErr := p.waitGone(ctx, rep.Targets, timeout)
	for _, id := range rep.Targets {
		if !slices.Contains(pending, id) {
			rep.Exited = append(rep.Exited, id)
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		rep.Survivors = pending
		return done(fmt.Errorf("stop %v in container %s: %d of %d processes left after %s: %w", t.Leader, p.r.Instance, len(pending), len(rep.Targets), sig, ctxErr))
	}
	killWait := t.KillWait
	if killWait <= 0 {
		killWait = proc.DefaultKillWait
	}
	for round := 0; round <= 3; round++ {
		more, err := p.snapshot(ctx, t, stats)
		if err != nil {
			rep.Survivors = pending
			return done(fmt.Errorf("stop %v in container %s: %w", t.Leader, p.r.Instance, err))
		}
		for _, s := range more {
			if _, ok := stats[s.Identity()]; !ok {
				stats[s.Identity()] = s
				rep.Targets = append(rep.Targets, s.Identity())
				pending = append(pending, s.Identity())
			}
		}
		if len(pending) == 0 {
			break
		}
		victims := make([]proc.Stat, 0, len(pending))
		for _, id := range pending {
			victims = append(victims, stats[id])
		}
		sendErr = errors.Join(sendErr, p.send(ctx, t, victims, syscall.SIGKILL))
		var left []proc.Identity
		left, waitErr = p.waitGone(ctx, pending, killWait)
		for _, id := range pending {
			if !slices.Contains(left, id) {
				rep.Killed = append(rep.Killed, id)
			}
		}
		pending = left
		if ctx.Err() != nil || len(pending) > 0 {
			break
		}
	}
	rep.Survivors = pending
	if len(pending) == 0 {
		return done(nil)
	}
	pids := make([]int, len(pending))
	for i, id := range pending {
		pids[i] = id.PID
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return done(fmt.Errorf("stop %v in container %s: %d processes left after SIGKILL: %s: %w", t.Leader, p.r.Instance, len(pending), p.describe(ctx, pids), ctxErr))
	}
	if cause := errors.Join(sendErr, waitErr); cause != nil {
		return done(fmt.Errorf("stop %v in container %s: %w: %s (%w)", t.Leader, p.r.Instance, proc.ErrSurvived, p.describe(ctx, pids), cause))
	}
	return done(fmt.Errorf("stop %v in container %s: %w: %s", t.Leader, p.r.Instance, proc.ErrSurvived, p.describe(ctx, pids)))
}

// snapshot returns the live processes inside that make up the target (see
// proc.FS.Stop for why a group or session counts only while anchored).
func (p remoteProcs) snapshot(ctx context.Context, t proc.Target, known map[proc.Identity]proc.Stat) ([]proc.Stat, error) {
	all, marked, err := p.all(ctx, t.Marker)
	if err != nil {
		return nil, err
	}
	return targetSet(all, marked, t, known), nil
}

// targetSet picks the target's members out of every process of a namespace by the
// host's rule (proc.Target.Members): marked holds the PIDs whose environment carries
// t.Marker. PID 1, the namespace's init, is never one (inside an instance the agent
// and its ancestors are not there to guard).
func targetSet(all []proc.Stat, marked map[int]bool, t proc.Target, known map[proc.Identity]proc.Stat) []proc.Stat {
	return t.Members(all, known, func(pid int) bool { return marked[pid] }, func(pid int) bool { return pid <= 1 })
}

// send delivers sig to the target's group (while a member is alive as itself) and to
// every member of set outside it, each only while it is still that process.
func (p remoteProcs) send(ctx context.Context, t proc.Target, set []proc.Stat, sig syscall.Signal) error {
	args := []string{strconv.Itoa(int(sig)), strconv.Itoa(t.PGID)}
	for _, s := range set {
		g := "-"
		if t.PGID != 0 && s.PGRP == t.PGID {
			g = "g"
		}
		args = append(args, fmt.Sprintf("%d:%d:%s", s.PID, s.StartTicks, g))
	}
	// A namespace that is gone needs no signal: the script only signals a PID whose
	// start time is the recorded one, which no process of another namespace has.
	if _, err := p.r.sh(ctx, signalScript, "agent-kill", args...); err != nil {
		return fmt.Errorf("signal %s in container %s: %w", sig, p.r.Instance, err)
	}
	return nil
}

// waitGone polls until every identity is gone, the wait d is over or ctx is done,
// and returns those still alive. A look that fails counts every one as alive.
func (p remoteProcs) waitGone(ctx context.Context, ids []proc.Identity, d time.Duration) ([]proc.Identity, error) {
	deadline := time.Now().Add(d)
	pending := slices.Clone(ids)
	for {
		all, _, err := p.all(ctx, "")
		if err == nil {
			live := map[proc.Identity]bool{}
			for _, s := range all {
				if !s.Dead() {
					live[s.Identity()] = true
				}
			}
			left := pending[:0]
			for _, id := range pending {
				if live[id] {
					left = append(left, id)
				}
			}
			pending = left
		}
		if len(pending) == 0 {
			return nil, nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return pending, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(p.interval(), time.Until(deadline)+time.Millisecond)):
		}
	}
}
