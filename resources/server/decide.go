package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/state"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
)

// serverDetail is what Check decided, for Apply.
type serverDetail struct {
	// prev is the previous record (its generation counts; its process, or what is left
	// of it, is stopped first when stop is set).
	prev *serverRecord
	stop bool
	// takeover is a foreign process holding the port, stopped because takeover = true.
	takeover *proc.Target
	// lastGen is the generation of a record stopped for good (server_delete.go): a new
	// launch continues its numbering.
	lastGen int
	// verify: prev runs and matches, but its launch was never verified (server_verify.go).
	verify bool
	// stopped is set by Apply once it stopped prev's live process (server_checkfirst.go).
	stopped bool
	// migrate: prev runs in the instance its container's migration retires; it is kept
	// running (Retiring) while the new generation launches (server_migrate.go).
	migrate bool
	// adopt: a running process found to be this server; the engine records it (the
	// diff's record update) and nothing else is done.
	adopt bool
	// revert: prev is a change's launch that failed, unverified: launch its way back
	// (server_revert.go). again: prev is a rolled-back generation that died; it is
	// relaunched as it was, not as the rejected change.
	revert, again bool
	// smoke: prev runs and matches, and the plan's smoke test changed since its last
	// run: run it against the running server (server_smoke.go).
	smoke bool
}

// Check observes the recorded process in /proc and its readiness, and the port.
func (s *Server) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if s.Delete {
		return s.checkAbsent(ctx, env)
	}
	s = s.liveView(env)
	var rec serverRecord
	has, err := env.State.Load(&rec)
	if err != nil {
		return nil, err
	}
	stopped := has && !rec.StoppedAt.IsZero()
	if stopped {
		has = false // stopped for good: a launch is a new start, numbered after it
	}
	places := []string{s.place}
	if has {
		places = append(places, rec.Place)
	}
	if _, err := s.memberDown(ctx, env, places...); err != nil {
		return nil, err
	}
	var found *agent.RecordUpdate // a pending launch settled
	if has && rec.Pending != nil {
		if has, found, err = s.recoverPending(env, &rec); err != nil {
			return nil, err
		}
	}
	d, err := s.decide(ctx, env, has, stopped, &rec)
	if d != nil && d.Record == nil {
		d.Record = found
	}
	if d != nil && has {
		d.Unfinished = unfinished(&rec)
	}
	return d, err
}

// decide is Check past the record: has says whether rec names a launch (stopped: a
// record stopped for good, whose generation a launch continues). It observes the
// process and the server's place, and decides what apply must do (compare), then adds
// what an operator should know (an endpoint that cannot be probed, a retiring
// generation, the preflight's verdict).
func (s *Server) decide(ctx context.Context, env *agent.Env, has, stopped bool, rec0 *serverRecord) (*agent.Diff, error) {
	rec := *rec0
	var err error
	// PIDs and start times in the namespace the record names (server_remote.go).
	alive := false
	if has {
		if alive, err = s.recordProcs(ctx, env, &rec).Alive(ctx, rec.id()); err != nil {
			return nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
		}
	}
	lc, err := s.lifecycle(ctx, env)
	var missing error // the container does not exist yet (a first plan)
	if errors.Is(err, errNoInstance) {
		missing, err = err, nil
	}
	var noEndpoint error // a plan may add the proxy device with this apply
	if errors.Is(err, errNoEndpoint) {
		noEndpoint, err = err, nil
	}
	if err != nil {
		return nil, err
	}
	if alive && noEndpoint != nil && len(s.identityChanges(&rec)) == 0 {
		// Never a relaunch for what the agent cannot probe.
		d := agent.NoChange()
		d.Warnings = append(d.Warnings, fmt.Sprintf("pid %d runs the plan's server, but its readiness cannot be probed: %v", rec.PID, noEndpoint))
		return d, nil
	}
	d, err := s.compare(ctx, env, lc, has, alive, &rec, missing)
	if d != nil {
		d.Derive()
		if det, ok := d.Detail.(*serverDetail); ok && stopped {
			det.lastGen = rec.Generation
		}
	}
	if d != nil && noEndpoint != nil {
		d.Warnings = append(d.Warnings, noEndpoint.Error())
	}
	if d != nil && has && rec.Retiring != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("migration: generation %d (pid %d) in %s keeps serving until this one and everything that depends on it verified; then it is stopped, verified",
			rec.Retiring.Generation, rec.Retiring.PID, rec.Retiring.Place))
	}
	if err == nil && d != nil && launches(d) {
		var prev *serverRecord
		if has {
			prev = &rec
		}
		if msg, fits := s.preflight(ctx, prev); !fits {
			if s.preflightMode == "enforce" {
				return nil, fmt.Errorf("preflight = \"enforce\": not launching: %s", msg)
			}
			d.Warnings = append(d.Warnings, "preflight: "+msg)
		}
	}
	return d, err
}

// compare decides from what runs: the recorded process alive (compareRunning), or a
// launch (a first one, or a relaunch of a generation that is gone) unless the port's
// holder is the plan's server already (portHolderDiff).
func (s *Server) compare(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, has, alive bool, rec0 *serverRecord, missing error) (*agent.Diff, error) {
	rec := *rec0
	if has {
		if d, handled, err := s.decideRevert(ctx, env, lc, &rec, alive); handled || err != nil {
			return d, err
		}
	}
	if alive {
		return s.compareRunning(ctx, env, lc, &rec)
	}
	det := &serverDetail{stop: has}
	d := &agent.Diff{Detail: det}
	if has {
		det.prev = &rec
		c := agent.Set("process", agent.Raw(fmt.Sprintf("pid %d (generation %d) is gone", rec.PID, rec.Generation)), agent.Raw("a new generation"))
		c.Note = "relaunch"
		d.Add(c.Because(agent.Restarts, agent.ReasonGone))
		if p := hostPath(ctx, lc, &rec); p != "" {
			if f, ok := lifecycle.Failure(p); ok {
				d.Warnings = append(d.Warnings, fmt.Sprintf("generation %d's log shows %s", rec.Generation, f))
			}
		}
		d.Changes = append(d.Changes, s.identityChanges(&rec)...)
	} else {
		d.Add(agent.Added("argv", agent.CommandLine(s.argv())).Because(agent.Creates, agent.ReasonMissing))
		// Each variable: the values of those that are not secrets.
		for _, c := range keyChanges("env", nil, s.env, func(v string) any { return v }, s.secretEnv) {
			d.Add(c.Because(agent.Creates, agent.ReasonMissing))
		}
		if s.port > 0 {
			d.Add(agent.Added("port", s.port).Because(agent.Creates, agent.ReasonMissing))
		}
	}
	if missing != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("%v yet: the server is launched in it once it does", missing))
		return d, nil
	}
	if s.port == 0 {
		return d, nil
	}
	return s.portHolderDiff(ctx, env, lc, d, det)
}

// compareRunning judges the recorded process, alive: a changed identity is a relaunch
// (make before break when its container migrates), a launch never verified is verified,
// and otherwise readiness decides (checkReady).
func (s *Server) compareRunning(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord) (*agent.Diff, error) {
	if changes := s.identityChanges(rec); len(changes) > 0 {
		if r := s.rejectedNow(rec); r != nil {
			markRejected(changes, r, env.Loop)
		}
		if s.migrating(rec) {
			d := &agent.Diff{Changes: changes, Detail: &serverDetail{prev: rec, migrate: true}}
			s.markMigration(d, rec)
			return d, nil
		}
		return &agent.Diff{Changes: changes, Detail: &serverDetail{prev: rec, stop: true}}, nil
	}
	if !rec.verified() {
		return s.verifyDiff(env, rec), nil
	}
	d, err := s.checkReady(ctx, env, lc, rec)
	if err == nil {
		s.smokeChanged(d, rec)
	}
	return d, err
}

// portHolderDiff completes d, a launch, with what holds the server's port: nothing (d as
// it is), the plan's own server started by someone else (an adoption instead of the
// launch), or a foreign process (an error, or its stop with takeover = true).
func (s *Server) portHolderDiff(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, d *agent.Diff, det *serverDetail) (*agent.Diff, error) {
	procs := lc.Place.Procs(ctx)
	owner, err := s.portHolder(ctx, procs, det.prev)
	if err != nil || owner == nil {
		return d, err
	}
	if s.matches(ctx, procs, owner) {
		if peer := recordedElsewhere(env, owner); peer != "" {
			d.Warnings = append(d.Warnings, fmt.Sprintf("port %d is held by pid %d, which runs this server's command line but is recorded as %s's: not adopted (two records never name one process); write moved { from = %s  to = %s } to rename it without a restart",
				s.port, owner.PID, peer, peer, s.addr))
			return d, nil
		}
		if other := ownedElsewhere(ctx, procs, env, owner.PID); other != "" {
			return nil, fmt.Errorf("port %d is held by pid %d, which runs this server's command line but was launched by the agent of state dir %s, which still owns it: not adopted (one owner per process, or either could stop it); manage it from that state dir, or stop it there first",
				s.port, owner.PID, other)
		}
		adopt := s.record()
		adopt.Generation = 0
		if det.prev != nil {
			adopt.Generation = det.prev.Generation
			adopt.LogPath = ""
		}
		adopt.PID, adopt.StartTicks, adopt.Adopted = owner.PID, owner.StartTicks, true
		if adopt.PIDNS, err = lc.Namespace(ctx); err != nil {
			return nil, fmt.Errorf("adopt pid %d: %w", owner.PID, err)
		}
		if owner.PGRP == owner.PID {
			adopt.PGID = owner.PGRP
		}
		if owner.Session == owner.PID {
			adopt.SID = owner.Session
		}
		adopt.LaunchedAt = time.Time{}
		if st, err := procStart(ctx, procs, owner.StartTicks); err == nil {
			adopt.LaunchedAt = st
		}
		return s.adoptDiff(ctx, env, lc, &adopt)
	}
	desc := describeProc(ctx, procs, owner.PID)
	if !s.takeover {
		return nil, fmt.Errorf("port %d is held by %s, which this agent did not start and which does not run this server's command line; it was not touched: stop it yourself, or set takeover = true to let the agent stop it", s.port, desc)
	}
	t := foreignTarget(*owner)
	det.takeover = &t
	c := agent.Removed("takeover", agent.Raw(desc))
	c.Note = "takeover = true: stopped, verified"
	effect := agent.Replaces // a foreign process gives way to the plan's
	if det.prev != nil {
		effect = agent.Restarts // the relaunch stops it on the way
	}
	d.Add(c.Because(effect, agent.ReasonForeign))
	return d, nil
}

// ownedElsewhere names the state directory of another live agent that launched pid (the
// AGENT_OWNER its launch carries, whose directory still has that identity), or "" when
// it is this state directory's, or no agent's that still exists.
func ownedElsewhere(ctx context.Context, procs lifecycle.Procs, env *agent.Env, pid int) string {
	environ, err := procs.Environ(ctx, pid)
	if err != nil || env.State == nil {
		return ""
	}
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, state.OwnerEnv+"=")
		if !ok {
			continue
		}
		id, dir, ok := state.ParseOwnerMark(v)
		if !ok {
			return ""
		}
		if mine, _ := state.OwnerOf(env.State.Dir()); mine == id {
			return ""
		}
		if live, err := state.OwnerOf(dir); err != nil || live != id {
			return "" // that state directory is gone or was remade: nobody owns it now
		}
		return dir + " (owner " + id + ")"
	}
	return ""
}

// adoptDiff is the adoption of a process the agent just proved runs exactly the plan's
// command line (this PID, with this start time): a planned change, as a Terraform import
// is, that nothing on the host changes; apply records it (the diff's record update) and
// restarts nothing. The adopted server is then judged as a recorded one (checkReady).
func (s *Server) adoptDiff(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, adopt *serverRecord) (*agent.Diff, error) {
	d, err := s.checkReady(ctx, env, lc, adopt)
	if err != nil {
		return nil, err
	}
	c := agent.Added("process", agent.Raw(fmt.Sprintf("pid %d, generation %d", adopt.PID, adopt.Generation)))
	c.Note = fmt.Sprintf("adopt pid %d: it already runs this exact command line on port %d; recorded as this server's, not restarted", adopt.PID, s.port)
	d.Changes = append([]agent.Change{c.Because(agent.Adopts, agent.ReasonUnrecorded)}, d.Changes...)
	d.Record = agent.SaveRecord(adopt, fmt.Sprintf("adopted pid %d, which runs this server's exact command line", adopt.PID))
	if d.Detail == nil {
		d.Detail = &serverDetail{adopt: true}
	}
	return d, nil
}

// checkReady judges a running server whose identity matches: ready is a no-op, and so
// is not ready within its grace; past it, a relaunch. When it finds the server not ready
// for the first time, or ready again, the diff carries rec updated.
func (s *Server) checkReady(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord) (*agent.Diff, error) {
	if lc == nil { // cannot be: the process runs in it
		return nil, fmt.Errorf("pid %d runs, but its container %s does not exist", rec.PID, s.container)
	}
	why := s.notReady(ctx, lc, rec)
	now := env.Now()
	if why == "" {
		if now, ok := livenessVerdict(env, rec); ok && now.verdict == lifecycle.Wedged {
			return s.wedgedDiff(rec, now.evidence, now.since), nil
		}
		d := agent.NoChange()
		if !rec.UnreadySince.IsZero() {
			rec.UnreadySince = time.Time{}
			d.Record = agent.SaveRecord(rec, fmt.Sprintf("pid %d is ready again", rec.PID))
		}
		return d, nil
	}
	var found *agent.RecordUpdate
	if rec.UnreadySince.IsZero() {
		rec.UnreadySince = now
		found = agent.SaveRecord(rec, fmt.Sprintf("pid %d found not ready: %s", rec.PID, why))
	}
	limit := rec.UnreadySince.Add(s.grace)
	if l := rec.LaunchedAt.Add(s.ready.Timeout); !rec.Adopted && l.After(limit) {
		limit = l
	}
	if now.Before(limit) {
		d := agent.NoChange()
		d.Record = found
		d.Warnings = append(d.Warnings, fmt.Sprintf("pid %d is not ready (%s) since %s; it is relaunched if still not ready at %s (unhealthy_grace %s)",
			rec.PID, why, rec.UnreadySince.Format(time.TimeOnly), limit.Format(time.TimeOnly), s.grace))
		return d, nil
	}
	c := agent.Set("readiness", agent.Raw(fmt.Sprintf("not ready since %s: %s", agent.HumanTime(rec.UnreadySince), why)), agent.Raw("a new generation"))
	c.Note = "restart: unhealthy for longer than unhealthy_grace " + s.grace.String()
	return &agent.Diff{Changes: []agent.Change{c.Because(agent.Restarts, agent.ReasonUnhealthy)}, Detail: &serverDetail{prev: rec, stop: true}, Record: found}, nil
}
