package server

import (
	"context"
	"fmt"
	"time"

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
	// reset: the GPU to reset once prev is stopped, before the launch (gpureset.go).
	reset *gpuReset
}

// Check observes the server (observe: its record, its process and its place, through
// the place's lifecycle, and the judgements the loop keeps), then decides from that
// alone (decide: no host, no clock, no I/O). The one thing it says itself is a held
// change's reason, once (sayHeld).
func (s *Server) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if s.Delete {
		return s.checkAbsent(ctx, env)
	}
	v, o, err := s.observe(ctx, env)
	if err != nil {
		return nil, err
	}
	d, held, err := v.decide(o, env.Loop)
	if held != "" {
		sayHeld(env, o.rec.Rejected, held)
	}
	return d, err
}

// decide is what apply must do, from the plan (s, the server as it runs now) and o
// alone: compare decides, then the diff gets what an operator should know (an endpoint
// that cannot be probed, a retiring generation, the preflight's verdict), the record
// update of a pending launch settled, and the break work a migration left. held is the
// reason the loop holds a rejected change back, when not said yet.
func (s *Server) decide(o *observation, loop bool) (d *agent.Diff, held string, err error) {
	rec := o.rec
	if d, ok := s.gpuFaultDiff(o); ok {
		return s.settled(o, d), "", nil
	}
	if o.alive && o.noEndpoint != nil && len(s.identityChanges(&rec)) == 0 {
		// Never a relaunch for what the agent cannot probe.
		d := agent.NoChange()
		d.Warnings = append(d.Warnings, fmt.Sprintf("pid %d runs the plan's server, but its readiness cannot be probed: %v", rec.PID, o.noEndpoint))
		return s.settled(o, d), "", nil
	}
	d, held, err = s.compare(o, &rec, loop)
	if d != nil {
		d.Derive()
		if det, ok := d.Detail.(*serverDetail); ok && o.stopped {
			det.lastGen = rec.Generation
		}
	}
	if d != nil && o.noEndpoint != nil {
		d.Warnings = append(d.Warnings, o.noEndpoint.Error())
	}
	if d != nil && o.has && rec.Retiring != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("migration: generation %d (pid %d) in %s keeps serving until this one and everything that depends on it verified; then it is stopped, verified",
			rec.Retiring.Generation, rec.Retiring.PID, rec.Retiring.Place))
	}
	if err == nil && d != nil && launches(d) && !o.fits {
		if s.preflightMode == "enforce" {
			return nil, held, fmt.Errorf("preflight = \"enforce\": not launching: %s", o.fitMsg)
		}
		d.Warnings = append(d.Warnings, "preflight: "+o.fitMsg)
	}
	if err == nil && d != nil && launches(d) {
		s.noteWarm(o, d)
	}
	return s.settled(o, d), held, err
}

// settled adds to d the record update of a pending launch settled (unless d updates the
// record itself) and the break work a migration left.
func (s *Server) settled(o *observation, d *agent.Diff) *agent.Diff {
	if d != nil && d.Record == nil {
		d.Record = o.found
	}
	if d != nil && o.has {
		d.Unfinished = unfinished(&o.rec)
	}
	return d
}

// compare decides from what runs: the recorded process alive (compareRunning), or a
// launch (a first one, or a relaunch of a generation that is gone) unless the port's
// holder is the plan's server already (portHolderDiff).
func (s *Server) compare(o *observation, rec *serverRecord, loop bool) (*agent.Diff, string, error) {
	if o.has {
		if d, held, handled, err := s.decideRevert(o, rec, loop); handled || err != nil {
			return d, held, err
		}
	}
	if o.alive {
		d, err := s.compareRunning(o, rec, loop)
		return d, "", err
	}
	det := &serverDetail{stop: o.has}
	d := &agent.Diff{Detail: det}
	if o.has {
		det.prev = rec
		c := agent.Set("process", agent.Raw(fmt.Sprintf("pid %d (generation %d) is gone", rec.PID, rec.Generation)), agent.Raw("a new generation"))
		c.Note = "relaunch"
		d.Add(c.Because(agent.Restarts, agent.ReasonGone))
		if o.failure != "" {
			d.Warnings = append(d.Warnings, fmt.Sprintf("generation %d's log shows %s", rec.Generation, o.failure))
		}
		d.Changes = append(d.Changes, s.identityChanges(rec)...)
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
	if o.missing != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("%v yet: the server is launched in it once it does", o.missing))
		return d, "", nil
	}
	if s.port == 0 {
		return d, "", nil
	}
	d, err := s.portHolderDiff(o, d, det)
	return d, "", err
}

// compareRunning judges the recorded process, alive: a changed identity is a relaunch
// (make before break when its container migrates), a launch never verified is verified,
// and otherwise readiness decides (checkReady).
func (s *Server) compareRunning(o *observation, rec *serverRecord, loop bool) (*agent.Diff, error) {
	if changes := s.identityChanges(rec); len(changes) > 0 {
		if r := s.rejectedNow(rec); r != nil {
			markRejected(changes, r, loop)
		}
		if s.migrating(rec) {
			d := &agent.Diff{Changes: changes, Detail: &serverDetail{prev: rec, migrate: true}}
			s.markMigration(d, rec)
			return d, nil
		}
		return &agent.Diff{Changes: changes, Detail: &serverDetail{prev: rec, stop: true}}, nil
	}
	if !rec.verified() {
		return s.verifyDiff(o.now, rec), nil
	}
	d, err := s.checkReady(o, rec, o.notReady)
	if err == nil {
		s.smokeChanged(d, rec)
	}
	return d, err
}

// portHolderDiff completes d, a launch, with what holds the server's port (o.holder):
// nothing (d as it is), the plan's own server started by someone else (an adoption
// instead of the launch), or a foreign process (an error, or its stop with takeover =
// true).
func (s *Server) portHolderDiff(o *observation, d *agent.Diff, det *serverDetail) (*agent.Diff, error) {
	h := &o.holder
	if h.err != nil || h.owner == nil {
		return d, h.err
	}
	owner := h.owner
	if h.runsPlan {
		if peer := h.recordedAs; peer != "" {
			d.Warnings = append(d.Warnings, fmt.Sprintf("port %d is held by pid %d, which runs this server's command line but is recorded as %s's: not adopted (two records never name one process); write moved { from = %s  to = %s } to rename it without a restart",
				s.port, owner.PID, peer, peer, s.addr))
			return d, nil
		}
		if other := h.ownedBy; other != "" {
			return nil, fmt.Errorf("port %d is held by pid %d, which runs this server's command line but was launched by the agent of state dir %s, which still owns it: not adopted (one owner per process, or either could stop it); manage it from that state dir, or stop it there first",
				s.port, owner.PID, other)
		}
		if h.nsErr != nil {
			return nil, fmt.Errorf("adopt pid %d: %w", owner.PID, h.nsErr)
		}
		adopt := s.adopted(det.prev, h)
		return s.adoptDiff(o, &adopt)
	}
	if !s.takeover {
		return nil, fmt.Errorf("port %d is held by %s, which this agent did not start and which does not run this server's command line; it was not touched: stop it yourself, or set takeover = true to let the agent stop it", s.port, h.desc)
	}
	t := foreignTarget(*owner)
	det.takeover = &t
	c := agent.Removed("takeover", agent.Raw(h.desc))
	c.Note = "takeover = true: stopped, verified"
	effect := agent.Replaces // a foreign process gives way to the plan's
	if det.prev != nil {
		effect = agent.Restarts // the relaunch stops it on the way
	}
	d.Add(c.Because(effect, agent.ReasonForeign))
	return d, nil
}

// adopted is the record of h's owner, the plan's server started by someone else, as an
// adoption records it: in place of prev (its generation), when there is one.
func (s *Server) adopted(prev *serverRecord, h *portHolding) serverRecord {
	adopt := s.record()
	adopt.Generation = 0
	if prev != nil {
		adopt.Generation = prev.Generation
		adopt.LogPath = ""
	}
	owner := h.owner
	adopt.PID, adopt.StartTicks, adopt.Adopted = owner.PID, owner.StartTicks, true
	adopt.PIDNS = h.ns
	if owner.PGRP == owner.PID {
		adopt.PGID = owner.PGRP
	}
	if owner.Session == owner.PID {
		adopt.SID = owner.Session
	}
	adopt.LaunchedAt = h.started
	return adopt
}

// adoptDiff is the adoption of a process the agent just proved runs exactly the plan's
// command line (this PID, with this start time): a planned change, as a Terraform import
// is, that nothing on the host changes; apply records it (the diff's record update) and
// restarts nothing. The adopted server is then judged as a recorded one (checkReady).
func (s *Server) adoptDiff(o *observation, adopt *serverRecord) (*agent.Diff, error) {
	d, err := s.checkReady(o, adopt, o.holder.notReady)
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

// checkReady judges a running server whose identity matches, not ready for why ("":
// ready): ready is a no-op, and so is not ready within its grace; past it, a relaunch.
// When it finds the server not ready for the first time, or ready again, the diff
// carries rec updated.
func (s *Server) checkReady(o *observation, rec *serverRecord, why string) (*agent.Diff, error) {
	if o.missing != nil { // cannot be: the process runs in it
		return nil, fmt.Errorf("pid %d runs, but its container %s does not exist", rec.PID, s.container)
	}
	now := o.now
	if why == "" {
		if now, ok := o.liveness.of(rec); ok && now.verdict == lifecycle.Wedged {
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
