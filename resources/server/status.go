package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// Status is the live state: the process, its generation's log and serving metrics,
// readiness, and the smoke test's verdict. A failed smoke test is "degraded", and the
// server is left alone.
func (s *Server) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	var rec serverRecord
	has, err := env.State.Load(&rec)
	if err != nil {
		return nil, err
	}
	if s.Delete || (has && !rec.StoppedAt.IsZero()) {
		return s.absentStatus(ctx, env, has, &rec)
	}
	if !has {
		return s.unlaunchedStatus(ctx, env), nil
	}
	s = s.liveView(env)
	if member, err := s.memberDown(ctx, env, s.place, rec.Place); err != nil {
		return &agent.Status{Summary: fmt.Sprintf("generation %d (pid %d) cannot be observed: %v", rec.Generation, rec.PID, err),
			Fields: []agent.Field{agent.TextField(agent.MemberField, "member", member)}}, nil
	}
	lc, err := s.lifecycle(ctx)
	if err != nil && !errors.Is(err, errNoEndpoint) {
		return &agent.Status{Healthy: false, Summary: fmt.Sprintf("generation %d (pid %d) cannot be observed: %v", rec.Generation, rec.PID, err)}, nil
	}
	procs := lc.ProcsIn(ctx, rec.PIDNS)
	if rec.Place != s.place {
		procs = s.recordProcs(ctx, &rec)
	}
	// Metrics are the numbers agent run exports as agent_server_<key>{resource="server.<name>", kind="server"}.
	st := &agent.Status{Healthy: true, Metrics: map[string]float64{
		"up": 0, "ready": 0, "generation": float64(rec.Generation), "restarts": float64(max(rec.Generation-1, 0)),
	}}
	alive, err := procs.Alive(ctx, rec.id())
	if err != nil {
		return nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
	}
	s.statusLaunch(ctx, env, st, lc, procs, &rec)
	m, logPath := statusLog(ctx, env, st, lc, &rec)
	if !alive {
		s.statusGone(ctx, st, procs, &rec, logPath)
		for _, p := range s.statusGPUFault(func(f agent.Field) { st.Fields = append(st.Fields, f) }, env, &rec) {
			st.Summary += "; " + p // held: not relaunched until the host reboots
		}
		return st, nil
	}
	s.statusLive(ctx, env, st, lc, &rec, m)
	return st, nil
}

// statusLaunch adds what the record says of the launch: its process, generation and
// place (and the migration's retiring generation).
func (s *Server) statusLaunch(ctx context.Context, env *agent.Env, st *agent.Status, lc *lifecycle.Lifecycle, procs lifecycle.Procs, rec *serverRecord) {
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	field(agent.NumberField("pid", "pid", rec.PID))
	if t, err := procStart(ctx, procs, rec.StartTicks); err == nil {
		field(agent.AgeField("started_at", "started", t, env.Now()))
	}
	gen := strconv.Itoa(rec.Generation)
	if rec.Adopted {
		gen += " (adopted: not launched by this agent)"
	}
	field(agent.NumberField("generation", "generation", rec.Generation).WithText(gen))
	if r := rec.Retiring; r != nil {
		field(agent.TextField("retiring", "retiring", fmt.Sprintf("generation %d (pid %d) in %s: a migration's old server, stopped once this one and its dependents verified", r.Generation, r.PID, r.Place)))
	}
	if s.container != "" {
		field(agent.TextField("container", "container", s.container))
		if member := incusMember(ctx, lc); member != "" {
			field(agent.TextField(agent.MemberField, "member", member))
		}
	}
}

// statusLog adds the generation's log and its newest line, and returns the serving
// figures read from it and where the agent reads it ("" when it cannot).
func statusLog(ctx context.Context, env *agent.Env, st *agent.Status, lc *lifecycle.Lifecycle, rec *serverRecord) (engines.Metrics, string) {
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	var m engines.Metrics
	logPath := hostPath(ctx, lc, rec)
	if rec.LogPath == "" {
		return m, logPath
	}
	field(agent.TextField("log", "log", rec.LogPath))
	m, err := lifecycle.ScanLog(ctx, logPath)
	switch {
	case err != nil:
		field(agent.TextField("newest_line", "newest line", "log unreadable: "+err.Error()))
	case m.LastLineTime.IsZero() && m.Lines == 0:
		field(agent.TextField("newest_line", "newest line", fmt.Sprintf("none: generation %d's log has no line yet", rec.Generation)))
	case m.LastLineTime.IsZero():
		field(agent.TextField("newest_line", "newest line", fmt.Sprintf("%d lines, none with a time (generation %d)", m.Lines, rec.Generation)))
	default:
		field(agent.AgeField("newest_line_at", "newest line", m.LastLineTime, env.Now()))
	}
	statusPhases(st, rec, m.Phases)
	statusWarm(st, rec)
	return m, logPath
}

// statusGone is the status of a recorded generation whose process is gone: the failure
// its log shows, and what happened since (statusIncident).
func (s *Server) statusGone(ctx context.Context, st *agent.Status, procs lifecycle.Procs, rec *serverRecord, logPath string) {
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	st.Healthy = false
	st.Summary = fmt.Sprintf("not running: pid %d (generation %d) is gone", rec.PID, rec.Generation)
	if logPath != "" {
		if f, ok := lifecycle.Failure(logPath); ok {
			field(agent.TextField("failure", "failure", f.String()))
			st.Summary += ": " + f.Title
		} else if tail, err := lifecycle.Tail(logPath, 1); err == nil && len(tail) > 0 {
			field(agent.TextField("last_line", "last line", tail[0]))
		}
	}
	s.statusIncident(ctx, field, st, rec, procs)
	for _, p := range s.statusRevert(field, st.Metrics, rec) {
		st.Summary += "; " + p
	}
}

// statusLive is the status of a running generation: drift, readiness, its serving
// figures (its log's, and /metrics when it is on) and the smoke test's verdict; any
// problem makes it degraded.
func (s *Server) statusLive(ctx context.Context, env *agent.Env, st *agent.Status, lc *lifecycle.Lifecycle, rec *serverRecord, m engines.Metrics) {
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	st.Metrics["up"] = 1
	var problems []string
	problems = append(problems, s.statusInFlight(field, rec)...)
	problems = append(problems, s.statusRevert(field, st.Metrics, rec)...)
	if changes := s.identityChanges(rec); len(changes) > 0 && s.rejectedNow(rec) == nil {
		var attrs []string
		for _, c := range changes {
			attrs = append(attrs, c.Attr)
		}
		problems = append(problems, "drift: restart of "+strings.Join(attrs, ", "))
	}
	ready := "being stopped by an apply in flight"
	if rec.StoppingSince.IsZero() {
		ready = s.notReady(ctx, lc, rec)
	}
	if ready == "" {
		field(agent.BoolField("ready", "readiness", true).WithText("ready"))
		st.Metrics["ready"] = 1
	} else {
		field(agent.BoolField("ready", "readiness", false).WithText("not ready: " + ready))
		problems = append(problems, "not ready")
	}
	problems = append(problems, s.statusLiveness(field, st.Metrics, env, rec, ready == "")...)
	problems = append(problems, s.statusGPUFault(field, env, rec)...)
	logFields(field, m, st.Metrics)
	if s.enableMetrics && s.port > 0 {
		if pm, err := lc.Metrics(ctx, s.port); err != nil {
			field(agent.TextField("metrics_error", "/metrics", "unavailable: "+err.Error()))
		} else {
			servingFields(field, "metrics_", "/metrics ", pm, nil)
		}
	}
	if s.smoke != nil && ready == "" && !env.Probe {
		// The smoke test loads the server (a completion of up to max_tokens): it runs
		// after a launch and on `agent status --smoke`, and status otherwise shows the
		// launch's verdict.
		problems = append(problems, s.launchSmokeVerdict(field, st.Metrics, rec)...)
	}
	if s.smoke != nil && ready == "" && env.Probe {
		problems = append(problems, s.statusSmoke(ctx, st, lc)...)
	}
	if len(problems) > 0 {
		st.Healthy = false
		st.Summary = fmt.Sprintf("degraded, generation %d running: %s", rec.Generation, strings.Join(problems, "; "))
		return
	}
	st.Summary = fmt.Sprintf("running, ready, generation %d", rec.Generation)
}

// statusSmoke runs the smoke test now (`agent status --smoke`) and returns its problem.
func (s *Server) statusSmoke(ctx context.Context, st *agent.Status, lc *lifecycle.Lifecycle) []string {
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	r, err := lifecycle.RunSmoke(ctx, nil, lc.Place.Endpoint(s.port), *s.smoke)
	switch {
	case err != nil:
		field(agent.TextField("smoke_test", "smoke test", "no answer").WithText("no answer: " + err.Error()))
		return []string{"smoke test got no answer"}
	case r.OK:
		field(agent.TextField("smoke_test", "smoke test", "passed").WithText(fmt.Sprintf("passed (repetition %.2f)", r.Repetition)))
		st.Metrics["smoke_test_passed"] = 1
		return nil
	default:
		field(agent.TextField("smoke_test", "smoke test", "failed").WithText("failed: " + r.Reason))
		field(agent.TextField("smoke_output", "smoke output", r.Output).WithText(strconv.Quote(r.Output)))
		return []string{"smoke test failed (" + r.Reason + "); the server is left running: a bad answer is a sampling problem, not a server fault"}
	}
}

// servingMetrics are the serving figures status shows: one table for the status lines
// (from this generation's log, and again from /metrics when it is on) and for the numbers
// agent run exports (agent_server_<key>).
var servingMetrics = []struct {
	label, key, format string
	get                func(*engines.Metrics) *float64
	// field is the status field's key where key ("" for counters not exported) is not it.
	field string
}{
	{"accept len", "accept_length", "%.2f", func(m *engines.Metrics) *float64 { return m.AcceptLen }, ""},
	{"accept rate", "accept_rate", "%.2f", func(m *engines.Metrics) *float64 { return m.AcceptRate }, ""},
	{"gen throughput", "gen_throughput_tokens_per_second", "%.2f token/s", func(m *engines.Metrics) *float64 { return m.GenThroughput }, ""},
	{"token usage", "token_usage", "%.2f", func(m *engines.Metrics) *float64 { return m.TokenUsage }, ""},
	{"mamba usage", "mamba_usage", "%.2f", func(m *engines.Metrics) *float64 { return m.MambaUsage }, ""},
	// Counters only /metrics has.
	{"prompt tokens", "", "%.0f", func(m *engines.Metrics) *float64 { return m.PromptTokens }, "prompt_tokens"},
	{"generation tokens", "", "%.0f", func(m *engines.Metrics) *float64 { return m.GenerationTokens }, "generation_tokens"},
	{"requests", "", "%.0f", func(m *engines.Metrics) *float64 { return m.Requests }, "requests"},
}

// servingFields adds a status line per figure m has, keys prefixed with keyPrefix and
// labels with prefix, and the figures with a key to metrics when metrics is not nil.
func servingFields(field func(agent.Field), keyPrefix, prefix string, m engines.Metrics, metrics map[string]float64) {
	for _, sm := range servingMetrics {
		v := sm.get(&m)
		if v == nil {
			continue
		}
		key := sm.key
		if sm.field != "" {
			key = sm.field
		}
		field(agent.NumberField(keyPrefix+key, prefix+sm.label, *v).WithText(fmt.Sprintf(sm.format, *v)))
		if metrics != nil && sm.key != "" {
			metrics[sm.key] = *v
		}
	}
}

// logFields adds the log's serving figures, its queue and the time of its newest batch line.
func logFields(field func(agent.Field), m engines.Metrics, metrics map[string]float64) {
	servingFields(field, "", "", m, metrics)
	if m.RunningReqs != nil {
		q := 0
		if m.QueueReqs != nil {
			q = *m.QueueReqs
		}
		field(agent.NumberField("requests_running", "requests", *m.RunningReqs).WithText(fmt.Sprintf("%d running, %d queued", *m.RunningReqs, q)))
	}
	if !m.LastEvent.IsZero() {
		field(agent.TimeField("newest_batch_line_at", "newest batch line", m.LastEvent))
	}
}
