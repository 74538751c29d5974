package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// A launch counts as converged only once it was verified: ready before ready.timeout,
// alive and still ready through ready.settle, and past its smoke test. An agent killed
// between the start and the end of that verification leaves a record with a PID but no
// VerifiedAt; the next Check turns it into a "verify" step instead of calling it
// converged, and that step completes the verification, failing with the launch's own log
// when the server dies (issue 13, 3).

// launchFailure is why the agent stopped a launch that failed its verification, kept
// for status: the reason, the log's verdict and the lines it quoted.
type launchFailure struct {
	At      time.Time `json:"at"`
	Reason  string    `json:"reason"`
	Verdict string    `json:"verdict,omitempty"`
	Tail    []string  `json:"tail,omitempty"`
	Stopped string    `json:"stopped,omitempty"`
	// Exited: it exited by itself (an OOM), the agent stopped nothing but leftovers.
	Exited bool `json:"exited,omitempty"`
}

// settleDuration reads ready.settle: a duration, 0 allowed ("0s": no settle period).
func settleDuration(p *string, bad func(hcl.Range, string, string), rng hcl.Range) time.Duration {
	if p == nil {
		return DefaultSettle
	}
	d, err := time.ParseDuration(*p)
	if err != nil || d < 0 {
		bad(rng, "Invalid duration", fmt.Sprintf("ready.settle = %q is not a duration such as \"10s\" (\"0s\" for none).", *p))
		return DefaultSettle
	}
	return d
}

// verified reports whether the recorded launch completed its verification: verified, or
// ready and settled with only its smoke test failed (a degraded server, left running and
// reported by status, not re-tested on every run). An adopted process was not launched
// by the agent: it was found serving, and readiness is all it is judged by.
func (r *serverRecord) verified() bool {
	return r.Adopted || !r.VerifiedAt.IsZero() || r.SmokeFailure != ""
}

// verifyDiff is the step that completes the verification of a running, matching launch.
func (s *Server) verifyDiff(now time.Time, rec *serverRecord) *agent.Diff {
	was := fmt.Sprintf("generation %d (pid %d) launched, never verified", rec.Generation, rec.PID)
	if !rec.LaunchedAt.IsZero() {
		was = fmt.Sprintf("generation %d (pid %d) launched %s ago, never verified", rec.Generation, rec.PID, agent.Age(now.Sub(rec.LaunchedAt)))
	}
	c := agent.Set("verification", agent.Raw(was), agent.Raw("ready, settled, smoke-tested"))
	c.Note = "verify: the agent that launched it stopped before verifying it"
	c = c.Because(agent.InPlace, agent.ReasonUnverified)
	return &agent.Diff{Changes: []agent.Change{c}, Detail: &serverDetail{prev: rec, verify: true}}
}

// verifyRecorded completes the verification of the recorded launch rec, as its own
// launch would have: what is left of ready.timeout since it was launched, the settle
// period, the smoke test. A launch that fails is stopped (verified) and reported with
// its own log.
func (s *Server) verifyRecorded(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord) error {
	x := &lifecycle.Launched{
		Started:    lifecycle.Started{ID: rec.id(), PGID: rec.PGID, SID: rec.SID, NS: rec.PIDNS},
		Generation: rec.Generation, LogPath: rec.LogPath, LaunchedAt: rec.LaunchedAt,
	}
	if x.LaunchedAt.IsZero() {
		x.LaunchedAt = env.Now()
	}
	env.Log.Info("verifying a launch an earlier agent did not see verified", "generation", rec.Generation, "pid", rec.PID)
	err := lc.Verify(ctx, x, lifecycle.LaunchOptions{
		Name: s.name, LogDir: s.logDir, Generation: rec.Generation, Port: s.port,
		Spec: lifecycle.Spec{Marker: rec.Marker}, Ready: s.ready, Smoke: s.smoke,
	})
	return s.recordVerification(ctx, env, lc, rec, x, err)
}

// recordVerification records how far the verification of launch x (recorded as rec) got,
// with its start phases once it verified (read from its log where lc runs it), and
// returns err, the launch's own error.
func (s *Server) recordVerification(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord, x *lifecycle.Launched, err error) error {
	if x == nil || rec.PID == 0 {
		return err
	}
	if !x.ReadyAt.IsZero() {
		rec.ReadyAt = x.ReadyAt
	}
	rec.VerifiedAt = x.VerifiedAt
	if x.Smoke != nil || !rec.VerifiedAt.IsZero() {
		rec.SmokeDigest, rec.SmokeRanAt = smokeDigest(s.smoke), time.Time{} // the launch's own
	}
	if !rec.VerifiedAt.IsZero() {
		rec.LastGood = nil // verified: this generation is the way back from now on
	}
	var se *lifecycle.SmokeError
	if errors.As(err, &se) {
		rec.SmokeFailure = se.Result.Reason
	}
	if rec.verified() {
		recordStart(ctx, env, lc, rec)
	}
	var le *lifecycle.LaunchError
	if errors.As(err, &le) {
		rec.Failure = &launchFailure{At: env.Now(), Reason: le.Reason, Tail: le.Tail, Stopped: le.Stopped, Exited: le.Exited}
		if le.Failure != nil {
			rec.Failure.Verdict = le.Failure.String()
		}
	}
	if serr := env.State.Save(rec); serr != nil && err == nil {
		err = serr
	}
	return err
}

// launchSmokeVerdict adds the smoke test's verdict at launch to status (without running
// it), and returns the problem it is, if any.
func (s *Server) launchSmokeVerdict(field func(agent.Field), metrics map[string]float64, rec *serverRecord) []string {
	if problems, ok := s.smokeVerdict(field, metrics, rec); ok {
		return problems
	}
	switch {
	case rec.SmokeFailure != "":
		field(agent.TextField("smoke_test", "smoke test", "failed").WithText("failed at launch: " + rec.SmokeFailure + " (agent status --smoke runs it again)"))
		return []string{"smoke test failed at launch (" + rec.SmokeFailure + "); the server is left running: a bad answer is a sampling problem, not a server fault"}
	case !rec.VerifiedAt.IsZero():
		field(agent.TextField("smoke_test", "smoke test", "passed").WithText("passed at launch, " + rec.VerifiedAt.Format("2006-01-02 15:04:05") + " (agent status --smoke runs it again)"))
		metrics["smoke_test_passed"] = 1
	case rec.Adopted:
		field(agent.TextField("smoke_test", "smoke test", "not run").WithText("not run: adopted, not launched by this agent (agent status --smoke runs it)"))
	}
	return nil
}
