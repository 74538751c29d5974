package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
)

// Liveness (issue 26, SPEC "Keeping a host serving"): a ready server whose engine is
// wedged (its front end still answers, no token comes out) is found with proof and
// relaunched. The watch probes, and judges with lifecycle.LivenessWatch (wedged only
// when the probes went unanswered *and* the engine made no progress meanwhile); Check
// reads the verdict and decides the relaunch. Only `agent run` watches, so an `agent
// apply` never relaunches on a probe.

// livenessPlan is a server's liveness check as the plan gives it: the block's values
// (zero: the engine's default), or off. Without a block the engine's default applies to
// a server whose log names an engine the agent knows; another server (a static file
// server, a script) has no liveness check unless its block asks for one.
type livenessPlan struct {
	declared          bool
	off               bool // enabled = false
	http              string
	interval, timeout time.Duration
	failures          int
}

// bindLiveness reads the liveness block.
func (s *Server) bindLiveness(b *resources.Binder, c *ServerLivenessConfig) {
	if c == nil {
		return
	}
	r := b.R
	l := livenessPlan{declared: true, off: c.Enabled != nil && !*c.Enabled, http: resources.Deref(c.HTTP)}
	if c.Interval != nil {
		l.interval = b.Duration(c.Interval, 0, "liveness", "interval")
	}
	if c.Timeout != nil {
		l.timeout = b.Duration(c.Timeout, 0, "liveness", "timeout")
	}
	if c.Failures != nil {
		l.failures = *c.Failures
		if l.failures < 1 {
			b.Bad(r.Range("liveness", "failures"), "Invalid liveness.failures", fmt.Sprintf("liveness.failures counts consecutive failed probes before the engine's progress is looked at: at least 1, not %d.", l.failures))
		}
	}
	if l.http != "" && !strings.HasPrefix(l.http, "/") {
		b.Bad(r.Range("liveness", "http"), "Invalid liveness.http", "liveness.http is a path on the server's port, such as \"/health_generate\".")
	}
	if !l.off && s.port == 0 {
		b.Bad(r.Range("liveness"), "No port", "liveness probes the server's port: set port (or flags[\"port\"]), or enabled = false.")
	}
	s.liveness = l
}

// config is the check of a generation whose log names engine d (known: some line did):
// false when there is none.
func (l livenessPlan) config(d engines.Dialect, known bool) (lifecycle.Liveness, bool) {
	if l.off || !l.declared && !known {
		return lifecycle.Liveness{}, false
	}
	c := lifecycle.DefaultLiveness(d)
	if l.http != "" {
		c.Path = l.http
	}
	if l.interval > 0 {
		c.Interval = l.interval
	}
	if l.timeout > 0 {
		c.Timeout = l.timeout
	}
	if l.failures > 0 {
		c.Failures = l.failures
	}
	return c, true
}

// describe is the check for people: "/health_generate every 15s (timeout 20s, 3 failures in a row)".
func describeLiveness(c lifecycle.Liveness) string {
	return fmt.Sprintf("%s every %s (timeout %s, %d failures in a row)", c.Path, c.Interval, c.Timeout, c.Failures)
}

// livenessWarnEvery is how often a server that stays degraded (a busy engine failing its
// probes for hours) logs a failed probe as a warning: the first, then one per period; the
// others are debug lines.
const livenessWarnEvery = 5 * time.Minute

// serverLiveness is one server's judgement: of one generation (its process identity; a
// relaunch starts over).
type serverLiveness struct {
	mu       sync.Mutex
	id       proc.Identity
	gen      int
	logPath  string
	cfg      lifecycle.Liveness
	watch    *lifecycle.LivenessWatch // nil: no check for this generation
	follow   *lifecycle.LogFollower   // nil: its log cannot be read here
	next     time.Time                // when the next probe is due
	verdict  lifecycle.Verdict
	evidence string
	since    time.Time     // when the verdict became what it is
	warned   time.Time     // when a failed probe was last logged as a warning
	wedged   chan struct{} // closed once the verdict is Wedged
}

// livenessKey names env's server's liveness judgement in the loop's memory
// (agent.Memory), by state directory and address. The watch (a hint, which only `agent
// run` runs) feeds it and Check reads it. It outlives one watch, which every reconcile
// restarts, so that probes keep their pace and those in flight are still judged. It is
// not persisted: a verdict is about one running process, and an agent that restarts
// judges afresh.
func livenessKey(env *agent.Env) string {
	return "server liveness " + env.State.Dir() + "\x00" + env.Addr
}

// livenessOf is the judgement of env's server, made on first use.
func livenessOf(env *agent.Env) *serverLiveness {
	l, _ := env.Memory.LoadOrStore(livenessKey(env), &serverLiveness{})
	return l.(*serverLiveness)
}

// livenessNow is what the watch concluded of one generation so far.
type livenessNow struct {
	verdict  lifecycle.Verdict
	evidence string
	since    time.Time
	cfg      lifecycle.Liveness
	failed   int  // probes failed in a row
	busy     bool // degraded, and the engine progressed meanwhile
}

// watchedLiveness is what the watch concluded so far of the generation it judges (id):
// ok is false when it judges none (no `agent run`, no check).
type watchedLiveness struct {
	id  proc.Identity
	now livenessNow
	ok  bool
}

// livenessSeen is what the watch of env's server concluded so far.
func livenessSeen(env *agent.Env) watchedLiveness {
	if env.State == nil {
		return watchedLiveness{}
	}
	x, found := env.Memory.Load(livenessKey(env))
	if !found {
		return watchedLiveness{}
	}
	l := x.(*serverLiveness)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watch == nil {
		return watchedLiveness{}
	}
	return watchedLiveness{id: l.id, now: livenessNow{verdict: l.verdict, evidence: l.evidence, since: l.since, cfg: l.cfg, failed: l.watch.Failed(), busy: l.watch.Progressing()}, ok: true}
}

// of is the verdict on rec's generation; ok is false when the watch judges another.
func (w watchedLiveness) of(rec *serverRecord) (now livenessNow, ok bool) {
	if !w.ok || w.id != rec.id() {
		return now, false
	}
	return w.now, true
}

// wedged reports whether the watch found rec's generation wedged.
func (w watchedLiveness) wedged(rec *serverRecord) bool {
	now, ok := w.of(rec)
	return ok && now.verdict == lifecycle.Wedged
}

// livenessVerdict is what the watch concluded of rec's generation so far; ok is false
// when it has not judged it (no `agent run`, no check, another generation).
func livenessVerdict(env *agent.Env, rec *serverRecord) (now livenessNow, ok bool) {
	return livenessSeen(env).of(rec)
}

// startLiveness readies the judgement of rec's generation, whose log the agent reads at
// logPath ("" when it cannot): nil when the generation has no check.
func (s *Server) startLiveness(env *agent.Env, rec *serverRecord, logPath string) *serverLiveness {
	l := livenessOf(env)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != rec.id() || l.logPath != logPath {
		// Another generation: judged from nothing (the mutex stays, held).
		l.id, l.gen, l.logPath, l.watch, l.follow, l.cfg = rec.id(), rec.Generation, logPath, nil, nil, lifecycle.Liveness{}
		l.wedged = make(chan struct{})
		if logPath != "" {
			l.follow = lifecycle.LogOf(logPath) // shared with status's reads of it
		}
	}
	var d engines.Dialect
	known := false
	if l.follow != nil {
		_, d, known, _ = l.follow.Read()
	}
	cfg, on := s.liveness.config(d, known)
	if !on {
		l.watch = nil
		return nil
	}
	if l.watch == nil || cfg != l.cfg {
		// A new check (or a changed one) judges afresh, from its own first probe.
		if l.verdict == lifecycle.Wedged {
			l.wedged = make(chan struct{})
		}
		l.cfg, l.watch, l.verdict, l.evidence, l.since = cfg, lifecycle.NewLivenessWatch(cfg), lifecycle.Alive, "", env.Now()
		l.next = env.Now().Add(cfg.Interval)
	}
	return l
}

// due is when the next probe is.
func (l *serverLiveness) due() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// wedgedCh is closed once the verdict is Wedged.
func (l *serverLiveness) wedgedCh() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.wedged
}

// probe sends the next probe, without waiting for its answer: probes are one Interval
// apart, and each may take up to Timeout, so they overlap. A probe in flight is finished
// and judged even after the watch that sent it ended (every reconcile restarts it): its
// answer is evidence, and its own timeout bounds it.
func (l *serverLiveness) probe(env *agent.Env, lc *lifecycle.Lifecycle, port int) {
	l.mu.Lock()
	id, cfg := l.id, l.cfg
	l.next = env.Now().Add(cfg.Interval)
	l.mu.Unlock()
	ctx := context.Background()
	before := l.progress(ctx, lc, port, env.Now)
	go func() {
		p := lc.ProbeLiveness(ctx, port, cfg, env.Now)
		l.judge(id, p, before, l.progress(ctx, lc, port, env.Now), env.Log)
	}()
}

// progress is what the engine shows of its work now: its log's batch lines (read as
// the log grows) and its /metrics, each nil when it cannot be read.
func (l *serverLiveness) progress(ctx context.Context, lc *lifecycle.Lifecycle, port int, now func() time.Time) lifecycle.Progress {
	var fromLog, scraped *engines.Metrics
	if l.follow != nil {
		if m, _, _, err := l.follow.Read(); err == nil {
			fromLog = &m
		}
	}
	if m, err := lc.Metrics(ctx, port); err == nil {
		scraped = &m
	}
	return lifecycle.ProgressOf(fromLog, scraped, now())
}

// judge records probe p of generation id, and logs what changed: a first failure and a
// verdict at warning level, a wedge as an error with its evidence, a recovery.
func (l *serverLiveness) judge(id proc.Identity, p lifecycle.Probe, before, after lifecycle.Progress, log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != id || l.watch == nil {
		return // judged for another generation by now
	}
	was := l.verdict
	v, evidence := l.watch.Judge(p, before, after)
	if v != was {
		l.since = after.At
	}
	if was == lifecycle.Wedged && v != lifecycle.Wedged {
		l.wedged = make(chan struct{}) // it answered after all: a next wedge is news again
	}
	l.verdict, l.evidence = v, evidence
	attrs := []any{"pid", id.PID, "generation", l.gen, "probe", p.String()}
	switch {
	case v == lifecycle.Wedged && was != lifecycle.Wedged:
		close(l.wedged)
		log.Error("engine wedged: relaunching it", append(attrs, "evidence", evidence)...)
	case v == lifecycle.Degraded && (was != lifecycle.Degraded || after.At.Sub(l.warned) >= livenessWarnEvery):
		l.warned = after.At
		log.Warn("liveness probe failed", append(attrs, "evidence", evidence)...)
	case v == lifecycle.Degraded:
		log.Debug("liveness probe failed", append(attrs, "evidence", evidence)...)
	case v == lifecycle.Alive && was != lifecycle.Alive:
		log.Info("liveness probe passes again", attrs...)
	}
}

// wedgeIncident is a generation found wedged and relaunched: kept in the record of the
// generation that replaced it, with the evidence, for status and for whoever reads the
// state afterwards.
type wedgeIncident struct {
	Generation int       `json:"generation"`
	PID        int       `json:"pid"`
	At         time.Time `json:"at"`
	Evidence   string    `json:"evidence"`
}

// wedgedDiff is the relaunch of rec's generation, proven wedged (evidence, since at):
// the record keeps the incident before the apply acts on it.
// A judgement is recorded (and logged) once: a relaunch that has to wait or fail leaves
// the incident in the record, and the next observation finds it there.
func (s *Server) wedgedDiff(rec *serverRecord, evidence string, at time.Time) *agent.Diff {
	r := *rec
	var record *agent.RecordUpdate
	if w := rec.Wedge; w == nil || w.Generation != rec.Generation || w.PID != rec.PID {
		r.Wedge = &wedgeIncident{Generation: rec.Generation, PID: rec.PID, At: at, Evidence: evidence}
		r.Wedges++
		record = agent.SaveRecord(&r, fmt.Sprintf("generation %d (pid %d) found wedged: %s", rec.Generation, rec.PID, evidence))
	}
	c := agent.Set("liveness", agent.Raw(evidence), agent.Raw("a new generation"))
	c.Note = "restart: the engine is wedged (its front end still answers)"
	return &agent.Diff{
		Changes: []agent.Change{c.Because(agent.Restarts, agent.ReasonWedged)},
		Detail:  &serverDetail{prev: &r, stop: true},
		Record:  record,
	}
}

// carryWedge keeps in a new generation's record the wedge of the one it replaces.
func carryWedge(r, prev *serverRecord) {
	if prev == nil {
		return
	}
	r.Wedges = prev.Wedges
	if w := prev.Wedge; w != nil && w.Generation == prev.Generation {
		r.Wedge = w
	}
}

// statusLiveness adds the liveness check and its verdict to a live generation's status,
// and returns the problem it is: a degraded verdict (probes fail while the engine
// progresses, or before a verdict) makes the server degraded, and nothing more. A server
// that is not ready (ready false) is not probed: readiness judges it first.
func (s *Server) statusLiveness(field func(agent.Field), metrics map[string]float64, env *agent.Env, rec *serverRecord, ready bool) []string {
	if w := rec.Wedge; w != nil {
		field(agent.TextField("wedge", "replaced", fmt.Sprintf("generation %d (pid %d), found wedged at %s and relaunched: %s", w.Generation, w.PID, agent.HumanTime(w.At), w.Evidence)))
	}
	metrics["wedges_total"] = float64(rec.Wedges)
	if !ready {
		return nil
	}
	now, ok := livenessVerdict(env, rec)
	if !ok {
		switch {
		case s.liveness.off:
			field(agent.TextField("liveness", "liveness", "off (enabled = false)"))
		case s.liveness.declared:
			c, _ := s.liveness.config(engines.SGLang, true)
			field(agent.TextField("liveness", "liveness", describeLiveness(c)+": probed by agent run"))
		}
		return nil
	}
	metrics["liveness_failed_probes"] = float64(now.failed)
	switch now.verdict {
	case lifecycle.Alive:
		field(agent.TextField("liveness", "liveness", "alive: "+describeLiveness(now.cfg)))
		return nil
	case lifecycle.Wedged:
		field(agent.TextField("liveness", "liveness", "wedged since "+agent.HumanTime(now.since)+": "+now.evidence))
		return []string{"engine wedged: relaunched at the next reconcile"}
	}
	field(agent.TextField("liveness", "liveness", "degraded since "+agent.HumanTime(now.since)+": "+now.evidence))
	problem := fmt.Sprintf("liveness probe %s failed %d in a row", now.cfg.Path, now.failed)
	if now.busy {
		problem += ", but the engine is making progress: slow, not wedged"
	}
	return []string{problem}
}
