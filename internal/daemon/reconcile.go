package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/state"
)

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// ErrBackoff is the error of a resource held back after failures.
var ErrBackoff = errors.New("waiting before the next try")

// ErrStopping is the error of a resource not started because the agent is stopping.
var ErrStopping = errors.New("not started: the agent is stopping")

// ErrTerminalHold is the error of a resource whose last error retrying cannot fix: it
// waits for a plan change, or for the host to change under it.
var ErrTerminalHold = errors.New("not retried until the plan or the host changes")

// WaitingError is the state of a resource that does not act because a dependency has not
// verified converged (yet, or since its last failure).
type WaitingError struct {
	Dep   string
	Cause string // the dependency's own error, when it failed
	// Held, for an orphan, is why its dependent serves its last good generation, which
	// needs the orphan: the dependent converged, but not on the plan's inputs.
	Held string
}

func (e *WaitingError) Error() string {
	if e.Held != "" {
		return "kept while " + e.Dep + " serves its last good generation, launched from it: " + e.Held
	}
	if e.Cause == "" {
		return "waiting for " + e.Dep + " to converge"
	}
	return "waiting for " + e.Dep + ", which failed: " + e.Cause
}

// held reports an error of a resource the loop did not act on: nothing was tried, so
// nothing failed (metrics and backoff learn nothing from it).
func held(err error) bool {
	var w *WaitingError
	return errors.Is(err, ErrBackoff) || errors.Is(err, ErrStopping) || errors.Is(err, ErrTerminalHold) || errors.As(err, &w) ||
		fleet.Waits(err)
}

// heldChange is, for an orphan addr waiting for a planned resource whose current record
// depends on it (agent.Engine.Deps), why that resource holds a rejected change: it
// converged, but serves its last good generation, which still needs the orphan.
func heldChange(eng *agent.Engine, addr string, ds *resState) string {
	if !eng.IsOrphan(addr) || ds == nil || ds.step == nil || ds.step.Diff == nil {
		return ""
	}
	return ds.step.Diff.Held
}

// rolloutsFor is the loop's rollout permits over store, made once.
func (d *Daemon) rolloutsFor(store *state.Store) *agent.Rollouts {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rollouts == nil {
		d.rollouts = agent.NewRollouts(store)
	}
	return d.rollouts
}

// wakeRollout queues the members of addr's rollout group that wait for it: a member's
// reconcile, whatever its outcome, may have freed a permit or ended a stop (under d.mu).
func (d *Daemon) wakeRollout(eng *agent.Engine, addr string) {
	for _, p := range eng.RolloutPeers(addr) {
		if ps := d.res[p]; ps != nil && ps.step != nil && agent.IsRolloutWait(ps.step.Err) {
			d.queue.Add(p)
		}
	}
}

// hold is the engine's Hold: once the agent is stopping, no step starts.
func (d *Daemon) hold(addr string) error {
	if d.stopping.Load() {
		return fmt.Errorf("%s: %w", addr, ErrStopping)
	}
	return nil
}

// engineOptions are the loop engine's options: the configured ones, with the daemon's
// log, hold and progress lines.
func (d *Daemon) engineOptions() agent.Options {
	opts := d.cfg.Engine
	opts.Log = d.log
	opts.Loop = true // whoever configured it, this engine is the loop's (Env.Loop)
	opts.Hold = d.hold
	opts.Memory = d.memory
	if opts.Progress == nil {
		opts.Progress = d.logProgress
	}
	return opts
}

func (d *Daemon) worker() {
	for {
		addr, ok := d.queue.Get()
		if !ok {
			return
		}
		d.process(addr)
		d.queue.Done(addr)
	}
}

// process is one turn of one resource: wait for its dependencies, respect its holds,
// else reconcile it with the loop's engine and schedule its next turn.
func (d *Daemon) process(addr string) {
	if d.stopping.Load() {
		return
	}
	d.mu.Lock()
	eng, gen, sh := d.eng, d.engGen, d.shape
	if !eng.Has(addr) {
		d.mu.Unlock()
		return
	}
	rs := d.state(addr)
	rs.stopWatch() // it is observed now; a watch on what it replaces would only echo
	for _, dep := range eng.Deps(addr) {
		ds := d.res[dep]
		held := heldChange(eng, addr, ds)
		if ds != nil && ds.converged && ds.gen == gen && held == "" {
			continue
		}
		w := &WaitingError{Dep: dep, Held: held}
		if ds != nil && ds.gen == gen && ds.step != nil && ds.step.Err != nil {
			var dw *WaitingError
			switch {
			case errors.As(ds.step.Err, &dw):
				w = dw // the root cause
			case errors.Is(ds.step.Err, ErrBackoff) || errors.Is(ds.step.Err, ErrTerminalHold):
				// Held back: the cause is its last failure, not the hold around it.
				w.Cause = lastFailure(ds)
			default:
				w.Cause = ds.step.Err.Error()
			}
		}
		var prev *WaitingError
		changed := rs.step == nil || !errors.As(rs.step.Err, &prev) || *prev != *w
		if w.Cause != "" {
			d.log.Debug("waiting for a dependency", "resource", addr, "dependency", w.Dep, "cause", w.Cause)
		} else {
			d.log.Debug("waiting for a dependency", "resource", addr, "dependency", w.Dep)
		}
		rs.step, rs.converged, rs.gen = &agent.Step{Addr: addr, Err: w}, false, gen
		d.mu.Unlock()
		if changed { // else nothing new to say: a wait costs nothing
			d.publish(addr)
			// Its dependents wait on it and name its root cause: they learn the new one
			// (a dependency that has since failed), instead of keeping the old wait.
			for _, dep := range sh.dependents[addr] {
				d.queue.Add(dep)
			}
		}
		// Queued again when the dependency changes (it converges, or fails: finish
		// queues its dependents), not at every resync: 10,000 resources waiting on one
		// download cost nothing meanwhile (issue 27). The loop stays level-based: a
		// wait is looked at again after waitRecheck in any case, so it never hangs on
		// one missed edge (a dependency whose verdict raced a reload was seen stuck
		// "waiting" under the chaos test).
		d.queue.AddAfter(addr, d.waitRecheck())
		return
	}
	now := time.Now()
	if rs.terminal {
		rs.inFlight, rs.phase, rs.phaseStart, rs.phaseLimit = true, "", now, 0
		d.mu.Unlock()
		if d.terminalHeld(eng, gen, addr, rs) {
			return
		}
		d.mu.Lock()
	} else if now.Before(rs.until) {
		if rs.converged && rs.gen == gen {
			// Its last repair was verified, but came soon after the one before (a
			// crash loop's backoff): the backoff holds its next repair, not the truth
			// about it. Observed, never acted on: while it still matches the plan it is
			// converged and serving, and says so.
			rs.inFlight = true
			d.mu.Unlock()
			if d.heldButConverged(eng, gen, addr, rs) {
				return
			}
			d.mu.Lock()
			rs.inFlight = false
		}
		// Queued while it waits (its watch saw it die again): not converged, whatever
		// it was, until a reconcile says so.
		rs.converged = false
		rs.step = &agent.Step{Addr: addr, Diff: lastDiff(rs), Err: fmt.Errorf("%s: %w (%d failures, next try in %s): last error: %s",
			addr, ErrBackoff, rs.failures, time.Until(rs.until).Round(100*time.Millisecond), lastFailure(rs))}
		d.log.Debug("backing off: not acting before the next try", "resource", addr, "failures", rs.failures,
			"next_try_in", time.Until(rs.until).Round(time.Millisecond).String())
		d.queue.AddAfter(addr, time.Until(rs.until))
		d.mu.Unlock()
		d.publish(addr)
		return
	}
	rs.inFlight, rs.phase, rs.phaseStart, rs.phaseLimit = true, "", now, 0
	d.mu.Unlock()

	ctx := d.withStopProgress(agent.WithPhase(d.work, d.notePhase), addr)
	st := eng.Reconcile(ctx, addr)
	if st.Err == nil {
		d.finishWork(ctx, eng, gen, addr, st)
	}
	if d.debugOn() {
		d.log.Debug("reconciled", append([]any{"resource", addr}, verdict(st)...)...)
	}
	d.settle(eng, gen, addr, rs, st, now)
}

// terminalHeld observes a resource under a terminal hold (never acting) and reports
// whether the hold stands. The hold ends when the observation differs from the one it
// was taken on: the host moved (the foreign port holder went away, the instance was
// replaced by hand), so trying again may now work.
func (d *Daemon) terminalHeld(eng *agent.Engine, gen int, addr string, rs *resState) bool {
	diff, err := eng.Observe(agent.WithPhase(d.work, d.notePhase), addr)
	seen := fingerprint(diff, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	rs.inFlight, rs.phase = false, ""
	if rs.holdSeen == "" {
		rs.holdSeen = seen
	}
	d.log.Debug("observed under a terminal error", "resource", addr, "host_changed", seen != rs.holdSeen)
	if seen != rs.holdSeen {
		d.log.Info("the host changed under a terminal error; trying again", "resource", addr)
		rs.terminal, rs.holdSeen, rs.failures, rs.until = false, "", 0, time.Time{}
		return false
	}
	rs.step = &agent.Step{Addr: addr, Diff: diff, Err: fmt.Errorf("%s: %w (terminal error: %s)", addr, ErrTerminalHold, lastFailure(rs))}
	d.queue.AddAfter(addr, d.resync())
	go d.publish(addr)
	return true
}

// heldButConverged observes a resource whose next repair waits out a backoff, and
// reports whether it still matches the plan: then it stays converged (its dependents go
// on, /status says healthy), its watch is armed again and it is looked at again at its
// resync or when its backoff ends, whichever comes first.
func (d *Daemon) heldButConverged(eng *agent.Engine, gen int, addr string, rs *resState) bool {
	began := time.Now()
	diff, err := eng.Observe(agent.WithPhase(d.work, d.notePhase), addr)
	d.mu.Lock()
	defer d.mu.Unlock()
	rs.inFlight, rs.phase = false, ""
	if err != nil || diff == nil || diff.Action != agent.NoOp || d.engGen != gen {
		return false
	}
	st := &agent.Step{Addr: addr, Diff: diff, Unfinished: diff.Unfinished, Duration: time.Since(began)}
	if d.debugOn() {
		d.log.Debug("reconciled", append(append([]any{"resource", addr}, verdict(st)...),
			"backoff_next_try_in", time.Until(rs.until).Round(time.Millisecond).String())...)
	}
	rs.step, rs.done = st, time.Now()
	d.armWatch(eng, gen, addr, rs)
	d.queue.AddAfter(addr, min(d.resync(), time.Until(rs.until)))
	go d.publish(addr)
	return true
}

// fingerprint is what an observation says, without the clock: equal fingerprints mean
// the host did not move.
func fingerprint(d *agent.Diff, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	b.WriteString(string(d.Action))
	for _, c := range d.Changes {
		fmt.Fprintf(&b, "\x00%s\x00%s\x00%s", c.Attr, c.Old, c.New)
	}
	return b.String()
}

// notePhase records that a guarded step of addr starts: the watchdog judges it against
// its own limit.
func (d *Daemon) notePhase(addr, what string, limit time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rs := d.res[addr]; rs != nil && rs.inFlight {
		rs.phase, rs.phaseStart, rs.phaseLimit = what, time.Now(), limit
		if _, ok := acting[what]; ok {
			rs.action, rs.actionStart, rs.live, rs.liveAt, rs.progress = what, rs.phaseStart, nil, time.Time{}, nil
			go d.publish() // /status and the metrics say it is acting now
		}
	}
}

// state returns addr's state, creating it (under d.mu).
func (d *Daemon) state(addr string) *resState {
	rs := d.res[addr]
	if rs == nil {
		rs = &resState{}
		d.res[addr] = rs
	}
	return rs
}

// resync is a resource's next routine observation: the interval, jittered by ±10 % so
// that resources do not observe in lockstep.
func (d *Daemon) resync() time.Duration {
	iv := d.cfg.Interval
	if iv <= 0 && d.plan != nil && d.plan.Agent.Interval > 0 {
		iv = d.plan.Agent.Interval
	}
	if iv <= 0 {
		iv = DefaultInterval
	}
	return time.Duration(float64(iv) * (0.9 + 0.2*rand.Float64()))
}

// waitRecheck is how long a resource waiting for a dependency goes unlooked-at when
// nothing wakes it: ten resyncs. Its dependency's changes wake it; this only bounds a
// missed one.
func (d *Daemon) waitRecheck() time.Duration { return 10 * d.resync() }

// backoff is the wait after n failures in a row: doubling from BackoffMin, jittered by
// ±20 %, capped at BackoffMax.
func (d *Daemon) backoff(n int) time.Duration {
	lo, hi := orDefault(d.cfg.BackoffMin, DefaultBackoffMin), orDefault(d.cfg.BackoffMax, DefaultBackoffMax)
	w := lo << min(n-1, 20)
	if w <= 0 || w > hi {
		w = hi
	}
	return min(time.Duration(float64(w)*(0.8+0.4*rand.Float64())), hi)
}

// settle records a reconcile's outcome and schedules the resource's next turn.
func (d *Daemon) settle(eng *agent.Engine, gen int, addr string, rs *resState, st *agent.Step, start time.Time) {
	d.mu.Lock()
	rs.inFlight, rs.phase, rs.action, rs.live, rs.progress = false, "", "", nil, nil
	now := time.Now()
	was := rs.converged && rs.gen == gen // converged under this engine before this reconcile
	if errors.Is(st.Err, ErrStopping) {
		d.mu.Unlock()
		return
	}
	if fleet.Waits(st.Err) {
		// Its group is at max_unavailable (or the host is drained: agent drain, or the
		// host group's permits are held by other hosts, named in the error):
		// nothing was tried, so nothing failed and no backoff starts. It is queued
		// again as soon as a member of its group ends a reconcile (wakeRollout), and at
		// its resync in any case.
		rs.step, rs.converged, rs.gen, rs.done = st, false, gen, now
		d.queue.AddAfter(addr, d.resync())
		d.mu.Unlock()
		d.log.Info("waiting for its rollout group, the host permit or the drain's end", "resource", addr, "why", st.Err.Error())
		d.publish(addr)
		return
	}
	d.wakeRollout(eng, addr)
	rs.unavailable = false
	d.metrics.reconciles.WithLabelValues(addr, kindOf(addr)).Inc()
	d.metrics.duration.WithLabelValues(addr, kindOf(addr)).Observe(st.Duration.Seconds())
	drift := st.Diff != nil && st.Diff.Action != agent.NoOp
	if drift && rs.downSince.IsZero() {
		rs.downSince = start
	}
	// Drift is what stands after the reconcile: a verified repair leaves none, an orphan
	// the loop does not prune (a warning) or a failure leaves it.
	d.metrics.drift.WithLabelValues(addr, kindOf(addr)).Set(map[bool]float64{false: 0, true: 1}[drift && (st.Err != nil || !st.Applied)])
	failing := rs.step != nil && rs.step.Err != nil // its last reconcile failed
	rs.step, rs.done, rs.gen = st, now, gen
	next := d.resync()
	if st.Err == nil {
		d.settledOK(eng, gen, addr, rs, st, start, now, was, failing)
	} else if hostFault(st.Err) {
		next = d.settledHostFault(addr, rs, st, now)
	} else if wait, retry := d.settledFailed(eng, gen, addr, rs, st, start, now); retry {
		next = wait
	}
	d.recount(addr)
	if gen == d.engGen && d.allConverged() {
		d.metrics.lastSuccess.SetToCurrentTime()
	}
	d.queue.AddAfter(addr, next)
	rs.inFlight, rs.phaseStart, rs.phaseLimit = true, now, 0 // the status below is a step too
	d.mu.Unlock()

	d.observeSettled(eng, addr, rs, st)
}

// settledOK is settle's part for a reconcile that converged (d.mu held): repairs and
// crash loops counted, the stable period, dependents queued, the watch armed.
func (d *Daemon) settledOK(eng *agent.Engine, gen int, addr string, rs *resState, st *agent.Step, start, now time.Time, was, failing bool) {
	stable := orDefault(d.cfg.Stable, DefaultStable)
	if st.Applied {
		rs.repairs++
		took := now.Sub(rs.downSince)
		d.metrics.repairs.WithLabelValues(addr, kindOf(addr)).Inc()
		d.metrics.repairTime.WithLabelValues(addr, kindOf(addr)).Observe(took.Seconds())
		d.log.Info("converged", "resource", addr, "action", string(st.Diff.Action), "time_to_repair", took.Round(time.Millisecond).String())
		if !rs.verified.IsZero() && start.Sub(rs.verified) < stable && died(st.Diff) {
			// It was verified moments ago and had to be repaired already: a crash
			// loop, whose next repair waits its backoff. Each generation's quote
			// (the Check's warnings name its log's failure) goes to the history.
			rs.failures++
			rs.until = now.Add(d.backoff(rs.failures))
			after := start.Sub(rs.verified)
			if rs.lastFire.After(rs.verified) {
				after = rs.lastFire.Sub(rs.verified) // when its watch saw it go
			}
			d.addFailure(rs, now, fmt.Sprintf("%s: needed a %s %s after it was verified%s", addr, st.Diff.Action,
				after.Round(100*time.Millisecond), warnings(st.Diff)))
			d.metrics.failures.WithLabelValues(addr, kindOf(addr)).Inc()
			d.log.Warn("crash loop: repaired again soon after it was verified; its next repair waits", "resource", addr,
				"verified_for", after.Round(100*time.Millisecond).String(), "failures", rs.failures,
				"wait", time.Until(rs.until).Round(time.Millisecond).String())
		}
	}
	if failing && !st.Applied {
		// What failed cleared without a change (a cluster member back, a host
		// that has room again): said once, so that the log does not end at the failure.
		d.log.Info("converged again: its last failure cleared without a change", "resource", addr)
	}
	if st.Applied || rs.verified.IsZero() {
		rs.verified = now // a new generation: its stable period starts
	}
	if now.Sub(rs.verified) >= stable {
		if rs.failures > 0 {
			d.log.Debug("stable: the failure count and backoff reset", "resource", addr, "failures", rs.failures)
		}
		rs.failures = 0
	}
	if !st.Applied || rs.until.Before(now) {
		rs.until = time.Time{}
	}
	rs.converged, rs.terminal, rs.holdSeen, rs.downSince = true, false, "", time.Time{}
	if st.Applied || !was {
		eng.Record(st) // its dependencies, for ordering it as an orphan one day
	}
	if !was || st.Applied {
		for _, dep := range d.shape.dependents[addr] {
			d.queue.Add(dep)
		}
		// What it depends on may have break work that waited for it (a migrated
		// container's old instance): looked at again now.
		for _, up := range d.unfinishedDeps(eng, addr) {
			d.queue.Add(up)
		}
	}
	d.armWatch(eng, gen, addr, rs)
}

// settledHostFault is settle's part for a failure that was the host's (d.mu held): no
// backoff; the wait before the next try.
func (d *Daemon) settledHostFault(addr string, rs *resState, st *agent.Step, now time.Time) (next time.Duration) {
	// Never the resource's fault: the host cannot take the change now (its state or
	// log disk is full), and the server kind refused before stopping anything. No
	// failure counts toward its backoff: it is tried again at the shortest wait,
	// each time, so it goes ahead as soon as the host has room (issue 27: the
	// backoff kept it down 20 s after space returned).
	rs.converged = false
	wait := orDefault(d.cfg.BackoffMin, DefaultBackoffMin)
	rs.until, rs.terminal, rs.holdSeen = time.Time{}, false, ""
	d.addFailure(rs, now, st.Err.Error()+warnings(st.Diff))
	d.metrics.failures.WithLabelValues(addr, kindOf(addr)).Inc()
	d.log.Error("resource failed: the host cannot take the change now; no backoff", "resource", addr, "error", st.Err, "retry_in", wait.Round(time.Millisecond).String())
	next = wait
	for _, dep := range d.shape.dependents[addr] {
		d.queue.Add(dep)
	}
	return next
}

// settledFailed is settle's part for a failed reconcile (d.mu held): the failure
// counted, its backoff; retry reports whether it is tried again after wait (a terminal
// failure waits for its resync).
func (d *Daemon) settledFailed(eng *agent.Engine, gen int, addr string, rs *resState, st *agent.Step, start, now time.Time) (wait time.Duration, retry bool) {
	stable := orDefault(d.cfg.Stable, DefaultStable)
	rs.converged = false
	if rs.downSince.IsZero() {
		rs.downSince = start
	}
	if !rs.verified.IsZero() && now.Sub(rs.verified) >= stable {
		rs.failures = 0
	}
	rs.verified = time.Time{}
	rs.failures++
	wait = d.backoff(rs.failures)
	rs.until = now.Add(wait)
	rs.terminal = agent.IsTerminal(st.Err)
	rs.holdSeen = ""
	if rs.terminal && st.Diff == nil {
		rs.holdSeen = fingerprint(nil, st.Err) // it failed observing: that is what it saw
	}
	d.addFailure(rs, now, st.Err.Error()+warnings(st.Diff))
	d.metrics.failures.WithLabelValues(addr, kindOf(addr)).Inc()
	d.log.Error("resource failed", "resource", addr, "error", st.Err, "failures", rs.failures, "retry_in", wait.Round(time.Millisecond).String(), "terminal", rs.terminal)
	for _, dep := range d.shape.dependents[addr] {
		d.queue.Add(dep) // they report the root cause of their wait
	}
	if rs.unavailable = agent.IsUnavailable(st.Err); rs.unavailable {
		// What it waits for is outside the agent (its cluster member is offline):
		// its watch says when that may be back, and it is observed then, not at
		// the end of a backoff that grows to minutes over a long outage.
		d.armWatch(eng, gen, addr, rs)
	}
	return wait, !rs.terminal
}

// observeSettled observes the resource's own status after its reconcile: what /status
// and the metrics show.
func (d *Daemon) observeSettled(eng *agent.Engine, addr string, rs *resState, st *agent.Step) {
	var seen *agent.Diff
	if st.Err == nil {
		seen = agent.NoChange()
	}
	sst := eng.StatusOf(agent.WithPhase(d.work, d.notePhase), addr, seen)
	if sst.Status != nil {
		d.log.Debug("status observed", "resource", addr, "healthy", sst.Status.Healthy, "summary", sst.Status.Summary)
	} else if sst.Err != nil {
		d.log.Debug("status observed", "resource", addr, "error", sst.Err)
	}
	d.mu.Lock()
	rs.status = sst
	rs.inFlight, rs.phase = false, ""
	d.mu.Unlock()
	d.publish(addr)
}

// hostFault reports an error that was never the resource's: the host's disk is full (or
// over quota) where the agent records or logs.
func hostFault(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// died reports whether a repair was needed because what the agent launched died or went
// unhealthy on its own: only such a death, soon after a verified launch, is a crash. A
// planned relaunch (the plan changed: a restart or an update the agent chose) is not,
// however soon it comes: it neither counts a failure nor arms a backoff.
func died(d *agent.Diff) bool {
	for _, c := range d.Changes {
		switch c.Why() {
		case agent.ReasonGone, agent.ReasonUnhealthy:
			return true
		}
	}
	return false
}

// warnings is the diff's warnings (a dead server's log failure), for a failure's record.
func warnings(d *agent.Diff) string {
	if d == nil || len(d.Warnings) == 0 {
		return ""
	}
	return " (" + strings.Join(d.Warnings, "; ") + ")"
}

func (d *Daemon) addFailure(rs *resState, at time.Time, msg string) {
	rs.history = append(rs.history, failure{at: at, err: msg})
	if len(rs.history) > historyLen {
		rs.history = rs.history[len(rs.history)-historyLen:]
	}
}

func lastFailure(rs *resState) string {
	if len(rs.history) == 0 {
		return "unknown"
	}
	return rs.history[len(rs.history)-1].err
}

func lastDiff(rs *resState) *agent.Diff {
	if rs.step != nil {
		return rs.step.Diff
	}
	return nil
}

// armWatch starts watching a resource that just verified converged, or failed for
// something outside the agent (agent.Unavailable), when its kind can (agent.Watcher); a
// change it notices queues the resource at once, its backoff notwithstanding (under
// d.mu).
func (d *Daemon) armWatch(eng *agent.Engine, gen int, addr string, rs *resState) {
	if rs.watchCancel != nil || d.stopping.Load() {
		return
	}
	ctx, cancel := context.WithCancel(d.work)
	rs.watchID++
	id := rs.watchID
	rs.watchCancel = cancel
	go func() {
		d.log.Debug("watching for changes", "resource", addr)
		err := eng.Watch(ctx, addr)
		if ctx.Err() != nil {
			return
		}
		d.mu.Lock()
		mine := d.res[addr] == rs && rs.watchID == id && d.engGen == gen
		if mine {
			rs.watchCancel = nil
		}
		cancel()
		if !mine || err != nil {
			d.mu.Unlock()
			switch {
			case errors.Is(err, agent.ErrNothingToWatch):
				d.log.Debug("nothing to watch; observed at each resync", "resource", addr)
			case err != nil:
				d.log.Debug("watch failed; the resync interval still applies", "resource", addr, "error", err)
			}
			return
		}
		now := time.Now()
		if rs.downSince.IsZero() {
			rs.downSince = now // detection: the time to repair counts from here
		}
		if rs.unavailable && !rs.converged {
			// Its backoff waited for something outside the agent, which its watch
			// now says may be back: observed now (a fresh Check decides).
			rs.until = time.Time{}
		}
		wait := max(0, rs.lastFire.Add(watchRefire).Sub(now))
		rs.lastFire = now
		d.mu.Unlock()
		d.log.Info("change noticed; reconciling now", "resource", addr)
		d.queue.AddAfter(addr, wait)
	}()
}

// finishWork does addr's break work (agent.Finisher), which its reconcile's last
// observation reported (st.Unfinished), once addr itself verified converged and every
// resource of the plan that depends on it last verified converged under this engine: a
// migrated container's old instance is deleted only after the server in the new one is
// ready. Left waiting, it is done when a dependent converges. The engine verifies the
// finish with a fresh Check.
func (d *Daemon) finishWork(ctx context.Context, eng *agent.Engine, gen int, addr string, st *agent.Step) {
	what := st.Unfinished
	if what == "" {
		return
	}
	d.mu.Lock()
	var waiting []string
	for _, dep := range eng.PlanDependents(addr) {
		if rs := d.res[dep]; rs == nil || !rs.converged || rs.gen != gen {
			waiting = append(waiting, dep)
		}
	}
	d.mu.Unlock()
	if len(waiting) > 0 {
		d.log.Info("break work waits for dependents to converge", "resource", addr, "work", what, "waiting_for", waiting)
		return
	}
	if err := eng.Finish(ctx, st); err != nil {
		// The new half serves and verified: a failed finish (the old member offline)
		// must not hold the resource's dependents back from their repairs. Its Check
		// keeps saying what is left; it is tried again at each reconcile.
		d.log.Error("break work failed; tried again at its next reconcile", "resource", addr, "work", what, "error", err)
	}
}

// unfinishedDeps are the resources addr depends on, directly or not, whose last
// reconcile reported break work left. d.mu is held.
func (d *Daemon) unfinishedDeps(eng *agent.Engine, addr string) []string {
	var out []string
	for _, up := range eng.Upstream(addr) {
		if rs := d.res[up]; rs != nil && rs.step != nil && rs.step.Unfinished != "" {
			out = append(out, up)
		}
	}
	return out
}
