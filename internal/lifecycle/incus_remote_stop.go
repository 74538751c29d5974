package lifecycle

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/agent-dev/agent/internal/proc"
)

// Stop is proc.FS.Stop inside the instance, through exec: the one algorithm
// (proc.StopIn, with remoteProcs as its Namespace) over the same set (proc.Target.Members:
// the leader, its group and session while anchored by a member proved alive as itself,
// the processes carrying the marker, and every descendant of those), in the same order
// (sig to the group and to each member outside it, a wait of timeout, then SIGKILL to
// the survivors and to anything forked meanwhile, looked for again each round), with
// the same proof: every identity seen gone, its PID absent, a zombie, or another start
// time. A signal reaches a PID only after the script inside has read that PID's start
// time and found the recorded one. The instance's init (PID 1) is never a member. A
// namespace that is no longer the instance's (it restarted) holds nothing: the stop
// finds nothing and says so.
func (p remoteProcs) Stop(ctx context.Context, t proc.Target, sig syscall.Signal, timeout time.Duration) (proc.Report, error) {
	if err := t.Check(); err != nil {
		return proc.Report{Signal: sig}, err
	}
	return proc.StopIn(ctx, p, t, sig, timeout)
}

var _ proc.Namespace = remoteProcs{}

// Where names the instance in a stop's errors.
func (p remoteProcs) Where() string { return " in container " + p.r.Instance }

// Describe names processes with their command lines, for a stop's errors.
func (p remoteProcs) Describe(ctx context.Context, ids []proc.Identity) string {
	pids := make([]int, len(ids))
	for i, id := range ids {
		pids[i] = id.PID
	}
	return p.describe(ctx, pids)
}

// Members returns the live processes inside that make up the target (see
// proc.Target.Members for why a group or session counts only while anchored): for a
// stop's look, and for observation (Procs), each look bounded like any other read.
func (p remoteProcs) Members(ctx context.Context, t proc.Target, known map[proc.Identity]proc.Stat) ([]proc.Stat, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
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

// Signal delivers sig to the target's group (while a member is alive as itself) and to
// every member of set outside it, each only while it is still that process: the
// script inside reads each PID's start time before it signals it.
func (p remoteProcs) Signal(ctx context.Context, t proc.Target, set []proc.Stat, sig syscall.Signal) error {
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

// WaitGone polls until every identity is gone, the wait d is over or ctx is done,
// and returns those still alive. A look that fails counts every one as alive.
func (p remoteProcs) WaitGone(ctx context.Context, _ proc.Target, ids []proc.Identity, d time.Duration, _ syscall.Signal) ([]proc.Identity, error) {
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
