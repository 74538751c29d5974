package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/cmdline"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// Keeping a host serving (issue 25; docs/server.md, "Last good generation"). A change
// that relaunches a verified server stops it before the new generation starts (a GPU
// holds one of them), so a new generation that fails would leave the host serving
// nothing. Instead the agent goes back: the failed generation is stopped (verified, as
// always), the last verified generation's exact inputs (argv, environment, working
// directory, user, home, place) are launched again as a new generation and verified,
// and the change is recorded as rejected, with its time and the quote of its log:
//
//   - the record of a launch that changes a verified server keeps that server's inputs
//     (serverRecord.LastGood) until the launch is verified;
//   - the failed launch's record gets Rejected (what it launched, when, why) before the
//     revert starts, so an agent killed at any point of it finishes it on its next run
//     (Check: a dead, unverified launch with LastGood is a revert step), never launching
//     the rejected change a second time and never running two servers (every launch
//     follows a verified stop);
//   - the reverted generation's record keeps Rejected while the plan still asks for that
//     change: `agent run` does not launch it again (Check holds it with a terminal
//     error, logged once) until the plan changes; a person's `agent apply` tries it once
//     more; `agent plan` shows it marked rejected.
//
// revert = false turns this off.

// rejectedChange is a plan's change whose new generation failed and was rolled back.
type rejectedChange struct {
	// Generation is the failed generation; Identity what it launched (identity fields
	// only, secrets as digests): the plan asks for it again while identityChanges of it
	// is empty.
	Generation int           `json:"generation"`
	Identity   *serverRecord `json:"identity"`
	At         time.Time     `json:"at"`
	// Quote is what failed, quoted from its log (the failure line) or its verification.
	Quote string `json:"quote"`
	// RolledBackTo is the generation whose inputs were launched again, once that launch
	// is verified; 0 before.
	RolledBackTo int `json:"rolled_back_to,omitempty"`
	// Refused says why the last good inputs could not run again: nothing was launched.
	Refused string `json:"refused,omitempty"`
}

// identityOf is rec's launched identity alone: what a rejected change keeps, and what a
// revert launches again.
func identityOf(rec *serverRecord) *serverRecord {
	return &serverRecord{
		Generation: rec.Generation, Place: rec.Place, Argv: slices.Clone(rec.Argv), Command: slices.Clone(rec.Command),
		Flags: maps.Clone(rec.Flags), Args: slices.Clone(rec.Args), Env: maps.Clone(rec.Env), Workdir: rec.Workdir,
		User: rec.User, Home: rec.Home, HomeDir: rec.HomeDir, Port: rec.Port, StopSignal: rec.StopSignal, StopTimeout: rec.StopTimeout,
		VerifiedAt: rec.VerifiedAt,
	}
}

// good reports whether rec's launch served, verified: a revert may go back to it. A
// launch whose only failure was its smoke test is not one (it answered badly).
func (r *serverRecord) good() bool { return r.Adopted || !r.VerifiedAt.IsZero() }

// lastGoodFor is what a launch that replaces prev keeps as its way back: the inputs of
// the last generation that served verified, when reverting is on and the launch changes
// them (a relaunch of the same inputs, after a crash, has nothing to go back to). That
// is prev itself when it was verified; prev's own way back when prev is a change not
// verified yet (an agent killed during it); prev's inputs when prev is a rolled-back
// generation not verified yet (they served, verified, before the change it undid).
func (s *Server) lastGoodFor(prev *serverRecord) *serverRecord {
	if !s.revertOn() || prev == nil {
		return nil
	}
	var good *serverRecord
	switch {
	case prev.good():
		good = identityOf(prev)
	case prev.LastGood != nil:
		good = prev.LastGood
	case prev.RevertOf != 0:
		good = identityOf(prev)
	}
	if good == nil || good.Place != s.place || len(s.identityChanges(good)) == 0 {
		return nil
	}
	return good
}

// revertOn reports whether a failed change is rolled back (revert = true, the default).
func (s *Server) revertOn() bool { return !s.noRevert }

// rejectedNow returns the rejected change rec carries when the plan still asks for it
// exactly; nil otherwise (the plan changed: that change is history).
func (s *Server) rejectedNow(rec *serverRecord) *rejectedChange {
	r := rec.Rejected
	if r == nil || r.Identity == nil || !s.revertOn() || len(s.identityChanges(r.Identity)) > 0 {
		return nil
	}
	return r
}

// midRevert reports whether rec is a change's launch that failed (dead before it was
// verified) and has a way back that was not taken yet: an agent stopped during the
// revert, or during the launch, whose next step is the revert.
func (s *Server) midRevert(rec *serverRecord) bool {
	return s.revertOn() && rec.LastGood != nil && !rec.good() && (rec.Rejected == nil || rec.Rejected.Refused == "")
}

// revertDiff is the step that finishes a revert an agent did not (it was killed), or
// starts one for a change's launch that died unverified: launch the last good inputs.
func (s *Server) revertDiff(rec *serverRecord) *agent.Diff {
	c := agent.Set("process", agent.Raw(fmt.Sprintf("pid %d (generation %d, a change) failed before it was verified", rec.PID, rec.Generation)),
		agent.Raw(fmt.Sprintf("generation %d's command line again", rec.LastGood.Generation)))
	c.Note = "revert: the last verified generation's inputs are launched again"
	return &agent.Diff{Changes: []agent.Change{c.Because(agent.Restarts, agent.ReasonGone)}, Detail: &serverDetail{prev: rec, stop: true, revert: true}}
}

// markRejected notes, on the changes a plan or apply shows, that this change was tried
// and rolled back.
func markRejected(changes []agent.Change, r *rejectedChange, loop bool) {
	note := fmt.Sprintf("rejected at %s, rolled back: %s", agent.HumanTime(r.At), r.Quote)
	if !loop {
		note += "; `agent apply` tries it once more"
	}
	for i := range changes {
		if changes[i].Note != "" {
			changes[i].Note += "; "
		}
		changes[i].Note += note
	}
}

// holdRejected is the loop's verdict on a server whose plan asks again for a change that
// was rejected and rolled back: nothing is launched. A verified rolled-back generation is
// converged as far as the loop goes (it serves; its dependents go on; a rollout counts it
// available), with a warning that says why, and held, that why when the loop has not
// said it yet (sayHeld logs it, once). A rejection that could not be rolled back (nothing
// serves) is a terminal error: reported, never acted on.
func (s *Server) holdRejected(o *observation, rec *serverRecord, r *rejectedChange) (d *agent.Diff, held string, err error) {
	if r.Refused != "" {
		return nil, "", agent.Terminal(fmt.Errorf("the plan's change was rejected at %s: generation %d failed (%s) and could not be rolled back: %s; nothing of %s serves. `agent run` does not launch that change again until the plan changes it; `agent apply` tries it once more",
			agent.HumanTime(r.At), r.Generation, r.Quote, r.Refused, s.addr))
	}
	why := fmt.Sprintf("the plan's change was rejected at %s: generation %d failed (%s); generation %d serves generation %d's command line, rolled back. `agent run` does not launch that change again until the plan changes it; `agent apply` tries it once more",
		agent.HumanTime(r.At), r.Generation, r.Quote, rec.Generation, rolledBackOf(rec, r))
	if !o.said {
		held = why
	}
	d = agent.NoChange()
	d.Warnings = append(d.Warnings, why)
	d.Held = why // not converged on the plan's inputs: what it runs from is kept
	return d, held, nil
}

// sayHeld logs why the loop holds r back, and remembers that it did (agent.Memory): the
// reason is logged once, not at every pass.
func sayHeld(env *agent.Env, r *rejectedChange, why string) {
	if _, said := env.Memory.LoadOrStore(heldKey(env.Addr, r), true); !said {
		env.Log.Warn("not launching the plan's change: it was rejected and rolled back", "why", why)
	}
}

// heldKey names, in the loop's memory (agent.Memory), a rejected change the loop already
// said it holds (address and rejected generation): the reason is logged once, not at
// every pass.
func heldKey(addr string, r *rejectedChange) string {
	return fmt.Sprintf("server held %s#%d@%d", addr, r.Generation, r.At.UnixNano())
}

// rolledBackOf is the generation whose command line rec runs again.
func rolledBackOf(rec *serverRecord, r *rejectedChange) int {
	if rec.RevertOf != 0 {
		return rec.RevertOf
	}
	return r.RolledBackTo
}

// failureQuote is the one line that says why a launch failed: the failure its log shows
// (an OOM, a bad flag), else the verification's reason.
func failureQuote(err error, rec *serverRecord) string {
	var le *lifecycle.LaunchError
	var se *lifecycle.SmokeError
	switch {
	case errors.As(err, &le):
		q := le.Reason
		if le.Failure != nil {
			q = le.Failure.Title
			if le.Failure.Line != "" {
				q += ": " + le.Failure.Line
			}
		} else if n := len(le.Tail); n > 0 {
			q += ": " + le.Tail[n-1]
		}
		return q
	case errors.As(err, &se):
		return "smoke test failed: " + se.Result.Reason
	case err != nil:
		q, _, _ := strings.Cut(err.Error(), "\n")
		return q
	}
	if f := rec.Failure; f != nil {
		q := f.Reason
		if f.Verdict != "" {
			q, _, _ = strings.Cut(f.Verdict, " — ")
		}
		return q
	}
	return fmt.Sprintf("pid %d exited before it was verified", rec.PID)
}

// revertsOn reports whether err, the end of a change's launch, is a failure a revert
// answers: the launch exited, was not ready in time, did not settle, or failed its
// smoke test. An agent being stopped, or a record that could not be saved, is not one.
func revertsOn(err error) bool {
	var le *lifecycle.LaunchError
	var se *lifecycle.SmokeError
	return errors.As(err, &le) || errors.As(err, &se)
}

// asLaunched is s as it was when it launched good: the same kind, the plan's ready,
// stop and smoke settings, and good's exact inputs. A value recorded as a secret's
// digest is taken from the plan when the plan's value has that digest; otherwise the
// inputs cannot be rebuilt, and the error says which.
func (s *Server) asLaunched(good *serverRecord) (*Server, error) {
	g := *s
	g.command, g.args, g.workdir, g.user, g.home, g.port = slices.Clone(good.Command), slices.Clone(good.Args), good.Workdir, good.User, good.Home, good.Port
	if g.workdir == "" {
		g.workdir = defaultWorkdir
	}
	plain := s.plainRecord()
	g.env = map[string]string{}
	for k, v := range good.Env {
		if isDigest(v) {
			if pv, ok := plain.Env[k]; ok && secretDigest(pv) == v {
				v = pv
			} else {
				return nil, fmt.Errorf("env[%q] was a secret that the plan no longer holds", k)
			}
		}
		g.env[k] = v
	}
	g.flags = nil
	for _, name := range slices.Sorted(maps.Keys(good.Flags)) {
		display := good.Flags[name]
		if isDigest(display) {
			if pv, ok := plain.Flags[name]; ok && secretDigest(pv) == display {
				display = pv
			} else {
				return nil, fmt.Errorf("flags[%q] was a secret that the plan no longer holds", name)
			}
		}
		v := flagValue(display)
		if n, ok := v.(json.Number); ok {
			v = string(n) // a number, written as it was: "0.85", "30000"
		}
		argv, err := cmdline.Flag(name, v)
		if err != nil {
			return nil, fmt.Errorf("flags[%q]: %w", name, err)
		}
		g.flags = append(g.flags, serverFlag{name: name, argv: argv, display: display})
	}
	// The rebuilt command line must be the one that ran, byte for byte.
	want := good.Argv
	got := g.argv()
	if len(want) == 1 && isDigest(want[0]) {
		got = []string{secretDigest(strings.Join(got, "\x00"))}
	}
	if !slices.Equal(got, want) {
		return nil, fmt.Errorf("its command line cannot be rebuilt from its record (%s, rebuilt %s)", agent.CommandLine(want), agent.CommandLine(got))
	}
	return &g, nil
}

// modelPaths are the paths a launch reads that a revert checks first: its model.
func (s *Server) modelPaths() []string {
	for _, f := range s.flags {
		if f.name == "model-path" && len(f.argv) == 2 && strings.HasPrefix(f.argv[1], "/") {
			return []string{f.argv[1]}
		}
	}
	return nil
}

// revertedError is the end of an apply that rolled a failed change back: the apply
// fails (the plan's change did not happen) and says what serves. It is no terminal
// error: the loop's next pass finds the rolled-back generation serving and holds the
// change there (holdRejected).
type revertedError struct{ msg string }

func (e *revertedError) Error() string { return e.msg }

// revert rolls failed back: a change's launch that failed its verification (cause: that
// error; nil when a later run found it dead, unverified) goes back to failed.LastGood.
// The failed generation is gone first (stopped, verified, when it still runs: a failed
// smoke test leaves it running); the rejection is recorded before anything is launched;
// the last good inputs are checked (lifecycle.CanRelaunch) and launched as a new
// generation, verified. The error says what became of it.
func (s *Server) revert(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, failed *serverRecord, cause error) error {
	good := failed.LastGood
	quote := failureQuote(cause, failed)
	head := fmt.Sprintf("generation %d failed (%s)", failed.Generation, quote)
	if failed.PID != 0 {
		alive, err := lc.ProcsIn(ctx, failed.PIDNS).Alive(ctx, failed.id())
		if err != nil {
			return fmt.Errorf("%s; not rolled back: observe pid %d: %w", head, failed.PID, err)
		}
		if alive {
			rep, err := lc.StopIn(ctx, failed.PIDNS, failed.target(), s.stopSignal, s.stopTimeout, s.port)
			if err != nil {
				return fmt.Errorf("%s; not rolled back: stopping it failed: %w", head, err)
			}
			env.Log.Info("stopped", "generation", failed.Generation, "pid", failed.PID, "result", lifecycle.Summary(rep))
		}
	}
	rej := failed.Rejected
	if rej == nil || rej.Generation != failed.Generation {
		rej = &rejectedChange{Generation: failed.Generation, Identity: identityOf(failed), At: env.Now(), Quote: quote}
	}
	quote, head = rej.Quote, fmt.Sprintf("generation %d failed (%s)", failed.Generation, rej.Quote)
	failed.Rejected = rej
	if err := env.State.Save(failed); err != nil {
		return fmt.Errorf("%s; not rolled back: record the rejection: %w", head, err)
	}
	env.Log.Warn("rolling back a failed change", "generation", failed.Generation, "failure", quote, "to_generation", good.Generation)
	refuse := func(err error) error {
		rej.Refused = err.Error()
		serr := env.State.Save(failed)
		return agent.Terminal(errors.Join(fmt.Errorf("%s; not rolled back to generation %d's command line: %w; nothing of %s serves until the plan is fixed",
			head, good.Generation, err, s.addr), serr))
	}
	g, err := s.asLaunched(good)
	if err != nil {
		return refuse(fmt.Errorf("%w: %w", lifecycle.ErrCannotRelaunch, err))
	}
	logDir, err := lc.Place.HostPath(ctx, g.logDir)
	if err != nil {
		return refuse(err)
	}
	next, err := lifecycle.NextGeneration(logDir, g.name, failed.Generation)
	if err != nil {
		return refuse(err)
	}
	penv, err := launchEnv(env, g.env)
	if err != nil {
		return err
	}
	spec := lifecycle.Spec{Argv: g.argv(), Env: penv, Workdir: g.workdir, User: g.user, Home: g.serverHome(env)}
	if err := lc.CanRelaunch(ctx, spec, lifecycle.LogFile{Dir: g.logDir, Name: g.name, Generation: next}, g.modelPaths(), g.port, 2*time.Second); err != nil {
		return refuse(err)
	}
	rec, err := g.launchGeneration(ctx, env, lc, launchPlan{held: failed, prevGen: failed.Generation, keep: func(r *serverRecord) {
		r.Rejected, r.RevertOf, r.Reverts = rej, good.Generation, failed.Reverts+1
	}})
	if err != nil {
		return fmt.Errorf("%s; rolling back to generation %d's command line failed too: %w", head, good.Generation, err)
	}
	rej.RolledBackTo = good.Generation
	if err := env.State.Save(rec); err != nil {
		return fmt.Errorf("%s; rolled back to generation %d's command line, verified, serving as generation %d, but the record could not be saved: %w", head, good.Generation, rec.Generation, err)
	}
	env.Log.Warn("rolled back", "generation", rec.Generation, "pid", rec.PID, "command_line_of", good.Generation, "rejected", failed.Generation)
	env.Memory.Store(heldKey(env.Addr, rej), true) // this error says why; the loop's hold need not
	return (&revertedError{msg: fmt.Sprintf("%s; rolled back to generation %d's command line, verified, serving (generation %d, pid %d)",
		head, good.Generation, rec.Generation, rec.PID)})
}

// statusRevert adds to status what reverting did to this server: the change the plan
// asks for that was rolled back (its generation, time and quote, beside the serving
// generation), or why the last good inputs could not run again, and the numbers
// `agent run` exports (agent_server_reverts_total, agent_server_rolled_back). It
// returns the problem to report, if any: a server serving a rolled-back configuration
// is degraded, since it is not what the plan says.
func (s *Server) statusRevert(field func(agent.Field), metrics map[string]float64, rec *serverRecord) []string {
	metrics["reverts_total"] = float64(rec.Reverts)
	metrics["rolled_back"] = 0
	r := s.rejectedNow(rec)
	if r == nil {
		return nil
	}
	field(agent.NumberField("rejected_generation", "rejected", r.Generation).WithText(
		fmt.Sprintf("generation %d (the plan's change) failed at %s: %s", r.Generation, agent.HumanTime(r.At), r.Quote)))
	field(agent.TimeField("rejected_at", "rejected at", r.At))
	field(agent.TextField("rejected_failure", "rejected failure", r.Quote))
	if r.Refused != "" {
		field(agent.TextField("not_rolled_back", "not rolled back", r.Refused))
		return []string{fmt.Sprintf("the plan's generation %d failed at %s (%s) and could not be rolled back: %s", r.Generation, agent.HumanTime(r.At), r.Quote, r.Refused)}
	}
	b := rolledBackOf(rec, r)
	if rec.RevertOf == 0 || b == 0 {
		return nil // the record is the failed launch itself: a revert is under way
	}
	metrics["rolled_back"] = 1
	field(agent.NumberField("rolled_back_to", "rolled back to", b).WithText(
		fmt.Sprintf("generation %d's command line, run again as generation %d", b, rec.Generation)))
	return []string{fmt.Sprintf("serving generation %d (generation %d's command line): the plan's generation %d was rolled back at %s: %s; `agent apply` tries it once more",
		rec.Generation, b, r.Generation, agent.HumanTime(r.At), r.Quote)}
}

// againDiff relaunches a rolled-back generation that died, with its own (rolled-back)
// inputs: the loop repairs what served, never the rejected change.
func (s *Server) againDiff(rec *serverRecord) *agent.Diff {
	c := agent.Set("process", agent.Raw(fmt.Sprintf("pid %d (generation %d, rolled back) is gone", rec.PID, rec.Generation)),
		agent.Raw(fmt.Sprintf("generation %d's command line again", rolledBackOf(rec, rec.Rejected))))
	c.Note = "relaunch: the plan's change stays rejected until the plan changes it"
	return &agent.Diff{Changes: []agent.Change{c.Because(agent.Restarts, agent.ReasonGone)}, Detail: &serverDetail{prev: rec, stop: true, again: true}}
}

// decideRevert is what Check decides for a record a revert concerns, before anything
// else: handled says it decided. A change's launch that died unverified is rolled back
// (by an apply or the loop: an agent killed mid-revert finishes it). Under the loop, a
// plan that asks again for a rejected change launches nothing: a rolled-back generation
// not verified yet (an agent killed during its verification) is verified, a verified one
// is judged by its readiness alone (holdRejected), one that died or stays unhealthy is
// relaunched as it was, never as the rejected change.
func (s *Server) decideRevert(o *observation, rec *serverRecord, loop bool) (d *agent.Diff, held string, handled bool, err error) {
	if !o.alive && s.midRevert(rec) {
		return s.revertDiff(rec), "", true, nil
	}
	r := s.rejectedNow(rec)
	if r == nil || !loop {
		return nil, "", false, nil
	}
	switch {
	case !o.alive && rec.RevertOf != 0:
		return s.againDiff(rec), "", true, nil
	case !o.alive:
		d, held, err := s.holdRejected(o, rec, r)
		return d, held, true, err
	case !rec.verified():
		return s.verifyDiff(o.now, rec), "", true, nil
	}
	d, err = s.checkReady(o, rec, o.notReady)
	if err != nil {
		return nil, "", true, err
	}
	if det, ok := d.Detail.(*serverDetail); ok && det.stop {
		det.again = true // unhealthy past its grace: relaunched as it was
		return d, "", true, nil
	}
	hold, held, err := s.holdRejected(o, rec, r)
	if err != nil {
		return nil, "", true, err
	}
	d.Warnings = append(d.Warnings, hold.Warnings...)
	d.Held = hold.Held
	return d, held, true, nil
}
