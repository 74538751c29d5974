package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/engines"
)

// Liveness is a ready server's liveness check: a probe that proves the engine answers,
// not only its HTTP front end (issue 26). A front end can say 200 for hours while the
// engine behind it is wedged (a hung collective, a deadlocked scheduler, a GPU fallen
// off the bus), so the probe must reach the engine, and the verdict needs a second fact
// (LivenessWatch): no progress on the work the engine has.
type Liveness struct {
	Path     string        // GET on the server's port; 200 is alive
	Interval time.Duration // between probes
	Timeout  time.Duration // one probe's limit
	Failures int           // consecutive failures before the progress is looked at
}

// DefaultLiveness is the check of a server without a liveness block, by engine:
//
//   - SGLang: GET /health_generate, a real one-token generation that is answered as
//     soon as the detokenizer sends anything, so a busy engine answers it at no cost
//     (python/sglang/srt/entrypoints/http_server.py: health_generate; it gives up itself
//     after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s, with 503). 15 s, 20 s, 3.
//   - vLLM: GET /health, which asks the engine core (EngineClient.check_health raises
//     once the core is dead: vllm/entrypoints/openai/api_server.py). It does not run a
//     generation, so a hung core that is still alive passes it; the progress rule is
//     then what finds a wedge. 15 s, 20 s, 3.
//   - llama.cpp: GET /health, answered by the HTTP thread (503 while loading, 200 after;
//     tools/server/server.cpp): the same caveat. 15 s, 20 s, 3.
func DefaultLiveness(d engines.Dialect) Liveness {
	l := Liveness{Path: "/health_generate", Interval: 15 * time.Second, Timeout: 20 * time.Second, Failures: 3}
	if d == engines.VLLM || d == engines.LlamaCPP {
		l.Path = "/health"
	}
	return l
}

// ProbeKind says how a liveness probe went.
type ProbeKind string

// The outcomes of a probe. Only a probe the engine left unanswered (a timeout, a 5xx
// from a front end that gave up waiting) is evidence of a wedge; a refused connection is
// a front end or a process gone, which the process watch and readiness find.
const (
	ProbePassed  ProbeKind = "passed"
	ProbeTimeout ProbeKind = "timeout"
	ProbeStatus  ProbeKind = "status"  // an HTTP status other than 200
	ProbeConnect ProbeKind = "connect" // no HTTP answer at all
)

// Probe is one liveness probe.
type Probe struct {
	At     time.Time
	Took   time.Duration
	Kind   ProbeKind
	Status int // the HTTP status, when there was one
}

func (p Probe) unanswered() bool {
	return p.Kind == ProbeTimeout || p.Kind == ProbeStatus && p.Status >= 500
}

// String is "10:01:00 timed out after 20s" or "10:01:15 HTTP 503 after 20s".
func (p Probe) String() string {
	at := p.At.Format("15:04:05")
	took := p.Took.Round(100 * time.Millisecond)
	switch p.Kind {
	case ProbePassed:
		return fmt.Sprintf("%s passed in %s", at, took)
	case ProbeTimeout:
		return fmt.Sprintf("%s timed out after %s", at, took)
	case ProbeStatus:
		return fmt.Sprintf("%s HTTP %d after %s", at, p.Status, took)
	}
	return fmt.Sprintf("%s no answer after %s", at, took)
}

// ProbeLiveness runs one probe of l against the server's port.
func (l *Lifecycle) ProbeLiveness(ctx context.Context, port int, lv Liveness, now func() time.Time) Probe {
	p := Probe{At: now()}
	err := l.probeHTTP(ctx, port, lv.Path, lv.Timeout)
	p.Took = now().Sub(p.At)
	var se *statusError
	switch {
	case err == nil:
		p.Kind = ProbePassed
	case errors.As(err, &se):
		p.Kind, p.Status = ProbeStatus, se.code
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		p.Kind = ProbeTimeout
	default:
		p.Kind = ProbeConnect
	}
	return p
}

// statusError is an HTTP answer other than 200.
type statusError struct {
	path string
	code int
}

func (e *statusError) Error() string { return fmt.Sprintf("GET %s: HTTP %d", e.path, e.code) }

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// drain reads a little of a body so that the connection can be reused.
func drain(r io.Reader) { _, _ = io.Copy(io.Discard, io.LimitReader(r, 64<<10)) }

// Progress is what an engine showed of its work at one moment: the batch lines of this
// generation's log, and the counters and gauges of its /metrics (nil: not exported).
type Progress struct {
	At time.Time
	// Observed is false when neither the log nor /metrics could be read: then nothing
	// proves that the engine did no work, and no verdict of a wedge can be reached.
	Observed         bool
	Batches          int       // batch (SGLang) or stats (vLLM) lines in this generation's log so far
	LastBatch        time.Time // the newest one's time (whole seconds in SGLang's prefix)
	GenerationTokens *float64
	PromptTokens     *float64
	Requests         *float64
	Running          *int
	Queued           *int
}

// ProgressOf joins what the log (fromLog, this generation's) and /metrics (scraped) say,
// observed at at; nil is a source that could not be read.
func ProgressOf(fromLog, scraped *engines.Metrics, at time.Time) Progress {
	p := Progress{At: at, Observed: fromLog != nil || scraped != nil}
	if scraped != nil {
		p.GenerationTokens, p.PromptTokens, p.Requests = scraped.GenerationTokens, scraped.PromptTokens, scraped.Requests
		p.Running, p.Queued = scraped.RunningReqs, scraped.QueueReqs
	}
	if fromLog != nil {
		p.Batches, p.LastBatch = fromLog.Events, fromLog.LastEvent
		if p.Running == nil {
			p.Running = fromLog.RunningReqs
		}
		if p.Queued == nil {
			p.Queued = fromLog.QueueReqs
		}
	}
	return p
}

// movedSince says what moved between base and p, "" when nothing did.
func (p Progress) movedSince(base Progress) string {
	var moved []string
	if n := p.Batches - base.Batches; n > 0 || p.LastBatch.After(base.LastBatch) {
		moved = append(moved, fmt.Sprintf("%d new batch lines, newest at %s", max(n, 1), p.LastBatch.Format("15:04:05")))
	}
	grew := func(name string, now, then *float64) {
		if now != nil && then != nil && *now > *then {
			moved = append(moved, fmt.Sprintf("%s %s → %s", name, num(*then), num(*now)))
		}
	}
	grew("generation tokens", p.GenerationTokens, base.GenerationTokens)
	grew("prompt tokens", p.PromptTokens, base.PromptTokens)
	grew("requests", p.Requests, base.Requests)
	return strings.Join(moved, ", ")
}

// still describes the unchanged figures, for the evidence of a wedge.
func (p Progress) still(now time.Time) string {
	var parts []string
	if p.LastBatch.IsZero() {
		parts = append(parts, "no batch line in this generation's log")
	} else {
		parts = append(parts, fmt.Sprintf("newest batch line %s (%s old)", p.LastBatch.Format("15:04:05"), now.Sub(p.LastBatch).Round(time.Second)))
	}
	for _, c := range []struct {
		name string
		v    *float64
	}{{"generation tokens", p.GenerationTokens}, {"prompt tokens", p.PromptTokens}, {"requests", p.Requests}} {
		if c.v != nil {
			parts = append(parts, fmt.Sprintf("%s %s unchanged", c.name, num(*c.v)))
		}
	}
	if p.Running != nil {
		parts = append(parts, fmt.Sprintf("%d running", *p.Running))
	}
	if p.Queued != nil {
		parts = append(parts, fmt.Sprintf("%d queued", *p.Queued))
	}
	return strings.Join(parts, ", ")
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// Verdict is what a LivenessWatch concludes.
type Verdict string

// The verdicts. Only Wedged is a reason to relaunch: Degraded is reported, never acted on.
const (
	Alive    Verdict = "alive"
	Degraded Verdict = "degraded"
	Wedged   Verdict = "wedged"
)

// LivenessWatch judges one generation's liveness from its probes and its progress. The
// rule is the seed's: no kill on a hunch. A server is Wedged only when its last
// Failures probes all went unanswered by the engine and the engine made no progress
// since the first of them was sent (no new batch line, no counter that moved); the
// probes that were left unanswered were themselves queued work, so the engine had work
// and did none of it. A slow but busy engine fails probes while progressing: Degraded,
// never Wedged. Neither is an engine whose progress cannot be observed at all.
type LivenessWatch struct {
	cfg         Liveness
	probes      []Probe    // the current run of failed probes, oldest first
	before      []Progress // the progress observed as each of them was sent
	progressing bool       // the last verdict was Degraded because the engine progressed
}

// NewLivenessWatch starts the watch of one generation (a relaunch starts a new one).
func NewLivenessWatch(cfg Liveness) *LivenessWatch {
	if cfg.Failures < 1 {
		cfg.Failures = 1
	}
	return &LivenessWatch{cfg: cfg}
}

// Judge records probe p, with the progress observed as it was sent (before) and right
// after its answer (after), and returns the verdict and, for Degraded and Wedged, the
// evidence in words. Probes may overlap (one every Interval, each up to Timeout): they
// are judged in the order their answers come, which for probes of one timeout is the
// order they were sent.
func (w *LivenessWatch) Judge(p Probe, before, after Progress) (Verdict, string) {
	w.progressing = false
	if p.Kind == ProbePassed {
		w.probes, w.before = nil, nil
		return Alive, ""
	}
	w.probes, w.before = append(w.probes, p), append(w.before, before)
	if n := len(w.probes); n > w.cfg.Failures {
		w.probes, w.before = w.probes[n-w.cfg.Failures:], w.before[n-w.cfg.Failures:]
	}
	runs := w.describe()
	if len(w.probes) < w.cfg.Failures {
		return Degraded, fmt.Sprintf("liveness probe %s failed (%d of %d before a verdict): %s", w.cfg.Path, len(w.probes), w.cfg.Failures, runs)
	}
	for _, q := range w.probes {
		if !q.unanswered() {
			return Degraded, fmt.Sprintf("liveness probe %s failed %d times, not all for want of an answer from the engine: %s", w.cfg.Path, len(w.probes), runs)
		}
	}
	if !w.before[0].Observed || !after.Observed {
		return Degraded, fmt.Sprintf("liveness probe %s failed %d times in a row (%s), and the engine's progress cannot be observed (its log unreadable, no /metrics): not judged wedged", w.cfg.Path, len(w.probes), runs)
	}
	if moved := after.movedSince(w.before[0]); moved != "" {
		w.progressing = true
		return Degraded, fmt.Sprintf("liveness probe %s failed %d times in a row (%s), but the engine is making progress (%s): slow, not wedged", w.cfg.Path, len(w.probes), runs, moved)
	}
	return Wedged, fmt.Sprintf("engine wedged: %d liveness probes of %s in a row went unanswered (%s) and no progress since %s: %s",
		len(w.probes), w.cfg.Path, runs, w.probes[0].At.Format("15:04:05"), after.still(after.At))
}

// Failed is how many probes in a row failed so far.
func (w *LivenessWatch) Failed() int { return len(w.probes) }

// Progressing reports whether the last verdict was Degraded for an engine whose probes
// all went unanswered while it made progress: slow, not wedged.
func (w *LivenessWatch) Progressing() bool { return w.progressing }

func (w *LivenessWatch) describe() string {
	parts := make([]string, len(w.probes))
	for i, p := range w.probes {
		parts[i] = p.String()
	}
	return strings.Join(parts, "; ")
}
