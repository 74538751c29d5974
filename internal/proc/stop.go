package proc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultKillWait bounds the wait after SIGKILL when Target.KillWait is zero.
// A process in uninterruptible sleep (a GPU driver call) can outlive SIGKILL
// for a while; past this bound Stop reports it rather than waiting forever.
const DefaultKillWait = 5 * time.Second

// pollInterval is how often Stop and PortFree look again.
const pollInterval = 25 * time.Millisecond

// rescans bounds how often Stop looks for processes forked after its first
// snapshot before it gives up on the set ever settling.
const rescans = 3

var (
	// ErrSurvived is wrapped when a process outlives SIGKILL and the wait
	// after it.
	ErrSurvived = errors.New("processes survived SIGKILL")
	// ErrForeignRoot is wrapped when Stop is asked to signal PIDs read from a
	// procfs that is not the caller's own: the numbers would name strangers.
	ErrForeignRoot = errors.New("proc root is not this process's PID namespace")
	// ErrUnsafeTarget is wrapped when a target would take the agent itself,
	// its ancestors or PID 1 with it.
	ErrUnsafeTarget = errors.New("unsafe stop target")
)

// Target is what Stop stops: a launched server, named as the launcher
// recorded it.
type Target struct {
	// Leader is the process the agent launched.
	Leader Identity
	// PGID is the leader's process group (the launcher sets Setpgid, so it is
	// usually Leader.PID). The signal goes to the whole group with
	// kill(-PGID), which also reaches members forked after the snapshot.
	// Zero means the leader has no group of its own to signal.
	PGID int
	// SID, when not zero, adds every process of that session (for a leader
	// launched with Setsid).
	SID int
	// Marker, when not empty, is an exact KEY=VALUE entry the launcher put
	// in the leader's environment; every process that carries it is part of
	// the set. It is the one trace left by a descendant that called setsid
	// and whose parent exited: it is neither in the group nor in the tree.
	Marker string
	// KillWait bounds the wait after SIGKILL; zero means DefaultKillWait.
	KillWait time.Duration
}

// Report says what Stop did and what it verified. Every identity in
// Exited and Killed was seen gone: absent, a zombie, or its PID reused.
type Report struct {
	Signal syscall.Signal
	// LeaderGone is set when the leader was already gone (or its PID held by
	// another process) before anything was signalled.
	LeaderGone bool
	// Targets is every process the stop was aimed at, in the order found.
	Targets []Identity
	// Exited went away after the first signal, within the timeout.
	Exited []Identity
	// Killed needed SIGKILL, and are verified gone.
	Killed []Identity
	// Survivors are still alive after SIGKILL; Stop returns an error then.
	Survivors []Identity
	// Elapsed is the time from the first look to the last verification.
	Elapsed time.Duration
}

// Stop stops the target and proves it: it snapshots the set to stop (the
// leader, its process group, its session, processes carrying the marker, and
// every descendant of those, each as an Identity), sends sig to the group and
// to each member outside it, waits up to timeout for all to be gone, then
// SIGKILLs the survivors and anything forked meanwhile, and waits again up to
// t.KillWait. It returns an error wrapping ErrSurvived, naming the PIDs and
// their command lines, when something outlives SIGKILL; a cancelled ctx
// returns its error with the report so far. Nothing is ever signalled whose
// start time differs from the one seen in the snapshot, and nothing is chosen
// by name. A leader that is already gone is not an error: its leftovers are
// still stopped, and the report says so.
func (fs FS) Stop(ctx context.Context, t Target, sig syscall.Signal, timeout time.Duration) (Report, error) {
	if err := fs.checkTarget(t); err != nil {
		return Report{Signal: sig}, err
	}
	g, err := fs.guard(t)
	if err != nil {
		return Report{Signal: sig}, err
	}
	return StopIn(ctx, hostNamespace{fs: fs, guard: g}, t, sig, timeout)
}

// Namespace is what a stop needs from the processes of one PID namespace: this
// host's /proc (FS.Stop), or an instance's own, read and signalled through Incus exec
// (package lifecycle). StopIn is the one algorithm over either.
type Namespace interface {
	// Members returns the live processes that make up t now (Target.Members over
	// the namespace's processes); known are those earlier looks of this stop found.
	Members(ctx context.Context, t Target, known map[Identity]Stat) ([]Stat, error)
	// Signal delivers sig to t's process group (while a member of it is verified
	// alive as itself) and to every process of set outside it, each only while it is
	// still that process.
	Signal(ctx context.Context, t Target, set []Stat, sig syscall.Signal) error
	// WaitGone polls until every identity is gone, the wait d (after sig) is over or
	// ctx is done, and returns those still alive; one whose state cannot be read
	// counts as alive.
	WaitGone(ctx context.Context, t Target, ids []Identity, d time.Duration, sig syscall.Signal) ([]Identity, error)
	// Describe names processes with what an operator needs about a survivor.
	Describe(ctx context.Context, ids []Identity) string
	// Where is said after the leader in errors: "" for this host, " in container NAME".
	Where() string
}

// StopIn is Stop in the namespace ns, for a target t already checked (Target.Check,
// and whatever else the namespace guards).
func StopIn(ctx context.Context, ns Namespace, t Target, sig syscall.Signal, timeout time.Duration) (Report, error) {
	start := time.Now()
	rep := Report{Signal: sig}
	done := func(err error) (Report, error) {
		rep.Elapsed = time.Since(start)
		return rep, err
	}
	stop := "stop " + t.Leader.String() + ns.Where()
	first, err := ns.Members(ctx, t, nil)
	if err != nil {
		return done(fmt.Errorf("%s: %w", stop, err))
	}
	stats := make(map[Identity]Stat, len(first))
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

	sendErr := ns.Signal(ctx, t, first, sig)
	pending, waitErr := ns.WaitGone(ctx, t, rep.Targets, timeout, sig)
	for _, id := range rep.Targets {
		if !slices.Contains(pending, id) {
			rep.Exited = append(rep.Exited, id)
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		rep.Survivors = pending
		return done(fmt.Errorf("%s: %d of %d processes left after %s: %w", stop, len(pending), len(rep.Targets), sig, ctxErr))
	}

	// Escalate, and look again each round: a member may have forked during
	// the grace period or while dying, and those children must not outlive
	// the stop. Anything found late gets SIGKILL straight away. The loop
	// ends when a fresh look finds nothing new and nothing left.
	killWait := t.KillWait
	if killWait <= 0 {
		killWait = DefaultKillWait
	}
	for round := 0; round <= rescans; round++ {
		more, err := ns.Members(ctx, t, stats)
		if err != nil {
			rep.Survivors = pending
			return done(fmt.Errorf("%s: %w", stop, err))
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
		victims := make([]Stat, 0, len(pending))
		for _, id := range pending {
			victims = append(victims, stats[id])
		}
		sendErr = errors.Join(sendErr, ns.Signal(ctx, t, victims, syscall.SIGKILL))
		var left []Identity
		left, waitErr = ns.WaitGone(ctx, t, pending, killWait, syscall.SIGKILL)
		for _, id := range pending {
			if !slices.Contains(left, id) {
				rep.Killed = append(rep.Killed, id)
			}
		}
		pending = left
		if ctx.Err() != nil || len(pending) > 0 {
			break // what is left outlived SIGKILL; looking again will not help
		}
	}
	rep.Survivors = pending
	if len(pending) == 0 {
		return done(nil)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return done(fmt.Errorf("%s: %d processes left after SIGKILL: %s: %w", stop, len(pending), ns.Describe(ctx, pending), ctxErr))
	}
	if cause := errors.Join(sendErr, waitErr); cause != nil {
		return done(fmt.Errorf("%s: %w: %s (%w)", stop, ErrSurvived, ns.Describe(ctx, pending), cause))
	}
	return done(fmt.Errorf("%s: %w: %s", stop, ErrSurvived, ns.Describe(ctx, pending)))
}

// hostNamespace is this host's /proc as a stop's Namespace, with the processes the
// stop must never touch (the agent, its ancestors, PID 1) left out.
type hostNamespace struct {
	fs    FS
	guard guard
}

func (h hostNamespace) Members(_ context.Context, t Target, known map[Identity]Stat) ([]Stat, error) {
	return h.fs.snapshot(t, h.guard, known)
}

func (h hostNamespace) Signal(_ context.Context, t Target, set []Stat, sig syscall.Signal) error {
	return h.fs.send(t, set, sig)
}

func (h hostNamespace) WaitGone(ctx context.Context, t Target, ids []Identity, d time.Duration, sig syscall.Signal) ([]Identity, error) {
	return h.fs.waitGone(ctx, ids, d, t.Leader, sig)
}

func (h hostNamespace) Describe(_ context.Context, ids []Identity) string { return h.fs.describe(ids) }

func (hostNamespace) Where() string { return "" }

// describe names each process with its state and command line, which is
// what an operator needs to decide what to do about a survivor.
func (fs FS) describe(ids []Identity) string {
	parts := make([]string, 0, len(ids))
	for _, id := range ids {
		desc := fmt.Sprintf("pid %d", id.PID)
		if s, err := fs.Stat(id.PID); err == nil {
			desc += fmt.Sprintf(" state %c", s.State)
		}
		if argv, err := fs.Cmdline(id.PID); err == nil && len(argv) > 0 {
			desc += " " + strconv.Quote(strings.Join(argv, " "))
		}
		parts = append(parts, desc)
	}
	return strings.Join(parts, "; ")
}

func (fs FS) checkTarget(t Target) error {
	if err := t.Check(); err != nil {
		return err
	}
	return fs.checkRoot()
}

// Check refuses a target whose stop would take PID 1 (or any init) with it, or whose
// marker is not an exact KEY=VALUE entry, in whatever PID namespace it is read.
func (t Target) Check() error {
	switch {
	case t.Leader.PID <= 1:
		return fmt.Errorf("%w: leader pid %d", ErrUnsafeTarget, t.Leader.PID)
	case t.PGID < 0 || t.PGID == 1:
		return fmt.Errorf("%w: process group %d", ErrUnsafeTarget, t.PGID)
	case t.SID < 0 || t.SID == 1:
		return fmt.Errorf("%w: session %d", ErrUnsafeTarget, t.SID)
	case t.Marker != "" && !strings.Contains(t.Marker, "="):
		return fmt.Errorf("%w: marker %q is not KEY=VALUE", ErrUnsafeTarget, t.Marker)
	}
	return nil
}

// checkRoot makes sure PIDs read under the root are PIDs in this process's
// own namespace, the only ones kill(2) understands: its self link must name
// this process.
func (fs FS) checkRoot() error {
	self, err := os.Readlink(fs.path("self"))
	if err != nil || self != strconv.Itoa(os.Getpid()) {
		return fmt.Errorf("%w: %s/self is %q, this process is %d", ErrForeignRoot, fs.root(), self, os.Getpid())
	}
	return nil
}

// guard is the set of processes a stop must never touch: the caller, its
// ancestors (a shell or a systemd unit), and PID 1.
type guard map[int]bool

func (fs FS) guard(t Target) (guard, error) {
	all, err := fs.All()
	if err != nil {
		return nil, err
	}
	byPID := make(map[int]Stat, len(all))
	for _, s := range all {
		byPID[s.PID] = s
	}
	g := guard{1: true}
	for pid := os.Getpid(); pid > 0 && !g[pid]; {
		g[pid] = true
		s, ok := byPID[pid]
		if !ok {
			break
		}
		if t.PGID != 0 && s.PGRP == t.PGID {
			return nil, fmt.Errorf("%w: process group %d holds this process or its ancestor %d", ErrUnsafeTarget, t.PGID, pid)
		}
		if t.SID != 0 && s.Session == t.SID {
			return nil, fmt.Errorf("%w: session %d holds this process or its ancestor %d", ErrUnsafeTarget, t.SID, pid)
		}
		pid = s.PPID
	}
	return g, nil
}

// Members returns the processes a Stop of t would aim at now, without signalling
// anything: the same snapshot (Target.Members over this /proc, the caller, its
// ancestors and PID 1 left out), so that whoever asks which processes are the
// target's (the server kind, before calling a port holder foreign) gets the stop's
// answer. It fails, as Stop would, when t's group or session holds the caller.
func (fs FS) Members(t Target, known map[Identity]Stat) ([]Stat, error) {
	g, err := fs.guard(t)
	if err != nil {
		return nil, err
	}
	return fs.snapshot(t, g, known)
}

// snapshot returns the live processes that make up the target, each once
// (Target.Members over this /proc, with the guard left out).
func (fs FS) snapshot(t Target, g guard, known map[Identity]Stat) ([]Stat, error) {
	all, err := fs.All()
	if err != nil {
		return nil, err
	}
	carries := func(pid int) bool {
		env, err := fs.Environ(pid)
		// Unreadable or vanished: not provably ours, and a process
		// that vanished needs no stopping.
		return err == nil && slices.Contains(env, t.Marker)
	}
	return t.Members(all, known, carries, func(pid int) bool { return g[pid] }), nil
}

// Members is the one rule for which processes belong to the target, whoever reads
// them (this host's /proc, or an instance's read through Incus exec): out of all, the
// processes of one PID namespace, it picks the leader, its process group and session
// while anchored, every process carrying the marker (carries(pid) says whether one
// does; asked only when the target has a marker), and every descendant of those, each
// once and alive. known are processes an earlier look of the same stop proved
// members: they stay members and anchor the group, so children forked by a member
// after the first look are found even when the leader is gone. A process for which
// never(pid) holds is not one (the stopping agent, its ancestors, the namespace's
// init).
func (t Target) Members(all []Stat, known map[Identity]Stat, carries, never func(pid int) bool) []Stat {
	byPID := make(map[int]Stat, len(all))
	for _, s := range all {
		byPID[s.PID] = s
	}
	// A group or session ID names the launch's only while it is anchored: the
	// leader (alive, or a zombie not yet reaped, as itself) or a process an
	// earlier snapshot of this stop proved a member is in it now. The kernel
	// does not reuse a PID that a live group or session still carries, so an
	// anchored ID has been ours without a break. An unanchored one may have
	// died out and been reused: a foreign process that got the leader's old
	// PID, led its own group and left a child there would otherwise be
	// signalled. Then only the marker (and descent from a member) proves
	// membership. Members of our group started no earlier than the leader.
	anchored := func(in func(Stat) bool) bool {
		if l, ok := byPID[t.Leader.PID]; ok && l.StartTicks == t.Leader.StartTicks && in(l) {
			return true
		}
		for id := range known {
			if s, ok := byPID[id.PID]; ok && s.StartTicks == id.StartTicks && in(s) {
				return true
			}
		}
		return false
	}
	groupOK := t.PGID != 0 && anchored(func(s Stat) bool { return s.PGRP == t.PGID })
	sessionOK := t.SID != 0 && anchored(func(s Stat) bool { return s.Session == t.SID })
	member := func(s Stat) bool {
		if s.Dead() || never(s.PID) {
			return false
		}
		if _, ok := known[s.Identity()]; ok || s.Identity() == t.Leader {
			return true
		}
		started := t.PGID != t.Leader.PID || s.StartTicks >= t.Leader.StartTicks
		if groupOK && s.PGRP == t.PGID && started {
			return true
		}
		started = t.SID != t.Leader.PID || s.StartTicks >= t.Leader.StartTicks
		if sessionOK && s.Session == t.SID && started {
			return true
		}
		return t.Marker != "" && carries(s.PID)
	}
	var set []Stat
	var roots []int
	for _, s := range all {
		if member(s) {
			set = append(set, s)
			roots = append(roots, s.PID)
		}
	}
	for _, s := range Descendants(all, roots...) {
		if !s.Dead() && !never(s.PID) {
			set = append(set, s)
		}
	}
	return set
}

// send delivers sig to the target's process group and to every member of
// set outside it. The group signal goes out only while a member of the
// group is verified alive as itself, which keeps the group ID from having
// been recycled.
func (fs FS) send(t Target, set []Stat, sig syscall.Signal) error {
	var errs []error
	groupSent := false
	if t.PGID != 0 {
		for _, s := range set {
			if s.PGRP != t.PGID {
				continue
			}
			if alive, err := fs.Alive(s.Identity()); err != nil || !alive {
				continue
			}
			err := syscall.Kill(-t.PGID, sig)
			if err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("signal %s to process group %d: %w", sig, t.PGID, err))
			}
			groupSent = err == nil
			break
		}
	}
	for _, s := range set {
		if groupSent && s.PGRP == t.PGID {
			continue
		}
		if _, err := fs.Signal(s.Identity(), sig); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// waitGone polls until every identity is gone, the wait d is over or ctx is
// done, and returns those still alive. An identity whose state cannot be
// read counts as alive: gone must be seen, not assumed. The context's
// progress hook (WithStopProgress) hears of the wait after sig as it goes.
func (fs FS) waitGone(ctx context.Context, ids []Identity, d time.Duration, leader Identity, sig syscall.Signal) ([]Identity, error) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	progress, report, stopProgress := progressTicker(ctx, leader, sig, d)
	defer stopProgress()
	pending := slices.Clone(ids)
	for {
		var lastErr error
		left := pending[:0]
		for _, id := range pending {
			alive, err := fs.Alive(id)
			if err != nil {
				lastErr = err
			}
			if alive || err != nil {
				left = append(left, id)
			}
		}
		pending = left
		if len(pending) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return pending, lastErr
		case <-timer.C:
			return pending, lastErr
		case <-progress:
			report(len(pending))
		case <-tick.C:
		}
	}
}
