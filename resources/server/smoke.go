package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// A changed smoke test runs (issue 25, point 6). The smoke test is not part of the
// identity (changing it relaunches nothing), but a result is only worth showing for the
// test the plan declares: the record keeps which test last ran (SmokeDigest) and when;
// when the plan's test differs, the next apply or pass of `agent run` runs it against
// the running server, without a restart, and records the result. A failed smoke test of
// a running server is reported (status: degraded), never a reason to stop it.

// smokeNone is the SmokeDigest of a launch verified without a smoke test: a test added
// later runs at the next apply or pass. A record without SmokeDigest (written before it
// existed) is taken as matching the plan's test: an upgrade loads no server.
const smokeNone = "none"

// smokeDigest names the smoke test s declares (smokeNone for none).
func smokeDigest(sm *lifecycle.Smoke) string {
	if sm == nil {
		return smokeNone
	}
	b, _ := json.Marshal(sm) // plain data: maps are written in key order
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:12])
}

// smokeStale reports whether rec's last smoke result is of another test than the plan's.
func (s *Server) smokeStale(rec *serverRecord) bool {
	return s.smoke != nil && rec.SmokeDigest != "" && rec.SmokeDigest != smokeDigest(s.smoke)
}

// smokeChanged adds to d, the no-op of a running, ready, verified server, the run of a
// smoke test that changed since its last run: an in-place step, nothing restarted.
func (s *Server) smokeChanged(d *agent.Diff, rec *serverRecord) {
	if d == nil || d.Action != agent.NoOp || !s.smokeStale(rec) || !rec.StoppingSince.IsZero() {
		return
	}
	was := "none at launch"
	if rec.SmokeDigest != smokeNone {
		was = "another test, last run " + agent.HumanTime(s.smokeRanAt(rec))
	}
	c := agent.Set("smoke_test", agent.Raw(was), agent.Raw("the plan's test, run against the running server"))
	c.Note = "run now; a failure is reported (degraded), never a restart"
	d.Add(c.Because(agent.InPlace, agent.ReasonDiffers))
	d.Action = ""
	d.Derive()
	d.Detail = &serverDetail{prev: rec, smoke: true}
}

// smokeRanAt is when rec's last smoke result was taken.
func (s *Server) smokeRanAt(rec *serverRecord) time.Time {
	if !rec.SmokeRanAt.IsZero() {
		return rec.SmokeRanAt
	}
	return rec.VerifiedAt
}

// rerunSmoke runs the plan's smoke test against the running generation rec and records
// the result with its time. A failure leaves the server running and fails the step with
// what it answered.
func (s *Server) rerunSmoke(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord) error {
	env.Log.Info("running the changed smoke test against the running server", "generation", rec.Generation, "pid", rec.PID)
	r, err := lifecycle.RunSmoke(ctx, nil, lc.Place.Endpoint(s.port), *s.smoke)
	rec.SmokeDigest, rec.SmokeRanAt, rec.SmokeFailure = smokeDigest(s.smoke), env.Now(), ""
	switch {
	case err != nil:
		rec.SmokeFailure = "no answer: " + err.Error()
	case !r.OK:
		rec.SmokeFailure = r.Reason
	}
	if serr := env.State.Save(rec); serr != nil {
		return fmt.Errorf("record the smoke test's result: %w", serr)
	}
	if err != nil {
		return fmt.Errorf("the changed smoke test got no answer from generation %d: %w (the server was left running)", rec.Generation, err)
	}
	if !r.OK {
		return &lifecycle.SmokeError{Generation: rec.Generation, Result: r}
	}
	return nil
}

// smokeVerdict is status's smoke test line for what launchSmokeVerdict does not know: a
// changed test not run yet (never the old test's result), or the result of a test run
// against the running server after its launch. ok says it decided.
func (s *Server) smokeVerdict(field func(agent.Field), metrics map[string]float64, rec *serverRecord) ([]string, bool) {
	switch {
	case s.smokeStale(rec):
		field(agent.TextField("smoke_test", "smoke test", "not run").WithText("not run yet: the smoke test changed since its last run; the next apply or pass of agent run runs it (agent status --smoke runs it now)"))
		return nil, true
	case rec.SmokeRanAt.IsZero():
		return nil, false
	case rec.SmokeFailure != "":
		field(agent.TextField("smoke_test", "smoke test", "failed").WithText(fmt.Sprintf("failed at %s: %s (agent status --smoke runs it again)", agent.HumanTime(rec.SmokeRanAt), rec.SmokeFailure)))
		field(agent.TimeField("smoke_test_at", "smoke test at", rec.SmokeRanAt))
		return []string{"smoke test failed at " + agent.HumanTime(rec.SmokeRanAt) + " (" + rec.SmokeFailure + "); the server is left running: a bad answer is a sampling problem, not a server fault"}, true
	}
	field(agent.TextField("smoke_test", "smoke test", "passed").WithText(fmt.Sprintf("passed at %s (agent status --smoke runs it again)", agent.HumanTime(rec.SmokeRanAt))))
	field(agent.TimeField("smoke_test_at", "smoke test at", rec.SmokeRanAt))
	metrics["smoke_test_passed"] = 1
	return nil, true
}
