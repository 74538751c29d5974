package engines

import (
	"context"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Dialect is the engine whose log and /metrics are read. The values are the
// engine names `agent export` uses.
type Dialect string

// The dialects.
const (
	SGLang   Dialect = "sglang"
	VLLM     Dialect = "vllm"
	LlamaCPP Dialect = "llama.cpp"
)

// ReadyLine is the line each engine prints once it serves: SGLang after its
// warm-up request, vLLM when uvicorn's startup completes (the engine core is
// up by then), llama.cpp when its HTTP loop starts after the model loaded.
func ReadyLine(d Dialect) string {
	switch d {
	case VLLM:
		return "Application startup complete."
	case LlamaCPP:
		return "server is listening on"
	}
	return SGLangReadyLine
}

var (
	ansi = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	// vllmHead is vLLM's logger prefix, after an optional process tag:
	// "(APIServer pid=2548211) INFO 12-15 18:32:12 [loggers.py:259] ".
	vllmHead = regexp.MustCompile(`^(?:\((\w[\w ]*) pid=\d+\) )?(INFO|WARNING|ERROR|DEBUG|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[[^\]]+:\d+\] `)
	// vllmStats is vLLM's periodic stats line (v1 "Engine 000: …", v0 without
	// the engine, with Swapped/Pending).
	vllmStats = regexp.MustCompile(`(?:Engine (\d+): )?Avg prompt throughput: ([\d.]+) tokens/s, Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs,.*?(?:Waiting|Pending): (\d+) reqs, GPU KV cache usage: ([\d.]+)%(?:.*?Prefix cache hit rate: ([\d.]+)%)?`)
	vllmSpec  = regexp.MustCompile(`SpecDecoding metrics: .*?Mean acceptance length: ([\d.]+)(?:.*?Avg Draft acceptance rate: ([\d.]+)%)?`)
	// llamaTiming is llama.cpp's per-request timing ("prompt eval time = … /
	// 10 tokens (… ms per token, 81.01 tokens per second)", "eval time = …").
	llamaTiming = regexp.MustCompile(`(prompt )?eval time =\s*[\d.]+ ms /\s*\d+ (?:tokens|runs)\s*\(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second\)`)
	llamaListen = regexp.MustCompile(`server is listening on (\S+)`)
	vllmListen  = regexp.MustCompile(`Starting vLLM API server \d+ on (\S+)`)
)

// clean removes the terminal colours vLLM puts around its process tags.
func clean(line string) string {
	line = strings.TrimRight(line, "\r\n")
	if strings.IndexByte(line, 0x1b) >= 0 {
		line = ansi.ReplaceAllString(line, "")
	}
	return line
}

// vote says which engine one line comes from, "" when it says nothing.
func vote(line string) Dialect {
	bare := line // llama.cpp's newer logs start with a one-letter level: "E srv  load_model: …"
	if len(bare) > 2 && bare[1] == ' ' && strings.ContainsRune("IWEDT", rune(bare[0])) {
		bare = bare[2:]
	}
	switch {
	case vllmHead.MatchString(line), strings.Contains(line, "vLLM API server version"),
		strings.Contains(line, "(EngineCore"), strings.Contains(line, "(APIServer pid="):
		return VLLM
	case strings.HasPrefix(bare, "llama_model_load"), strings.HasPrefix(bare, "llama_"),
		strings.Contains(bare, "main: server is listening on"), strings.HasPrefix(bare, "srv "),
		strings.HasPrefix(bare, "slot "), strings.HasPrefix(bare, "ggml_"), strings.HasPrefix(bare, "common_init"),
		strings.Contains(bare, "llama_server:"), strings.HasPrefix(bare, "build: ") && strings.Contains(bare, "llama"):
		return LlamaCPP
	}
	if _, _, ok := SplitPrefix(line, time.UTC); ok {
		return SGLang
	}
	return ""
}

// tally counts the votes of a log's lines. SGLang imports parts of vLLM and
// prints some of its lines, so the majority decides, not the first vote.
type tally map[Dialect]int

func (t tally) add(line string) {
	if d := vote(line); d != "" {
		t[d]++
	}
}

func (t tally) winner() Dialect {
	best := SGLang
	for _, d := range []Dialect{VLLM, LlamaCPP} {
		if t[d] > t[best] {
			best = d
		}
	}
	return best
}

// Sniff names the dialect of a log from its lines; SGLang when nothing tells.
func Sniff(lines []string) Dialect {
	t := tally{}
	for _, l := range lines {
		t.add(clean(l))
	}
	return t.winner()
}

// stamp reads vLLM's month-day time: the year is the latest that puts it not
// after now.
func stamp(s string, loc *time.Location, now time.Time) (time.Time, bool) {
	t, err := time.ParseInLocation("01-02 15:04:05", s, loc)
	if err != nil {
		return time.Time{}, false
	}
	now = now.In(loc)
	t = time.Date(now.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, loc)
	if t.After(now.Add(time.Minute)) {
		t = t.AddDate(-1, 0, 0)
	}
	return t, true
}

// scanner folds lines of any dialect into one Metrics.
type scanner struct {
	m          Metrics
	votes      tally
	loc        *time.Location
	now        time.Time
	appStarted time.Time
	sawStartup bool
	phases     *phaseScan
}

func (s *scanner) line(raw string) {
	line := clean(raw)
	s.votes.add(line)
	s.phases.line(line, s.m.LastLineTime) // before this line's own time is read
	s.m.UpdateIn(line, s.loc)             // SGLang's lines; counts every line
	msg := line
	var at time.Time
	if h := vllmHead.FindStringSubmatchIndex(line); h != nil {
		if t, ok := stamp(line[h[6]:h[7]], s.loc, s.now); ok {
			at = t
			s.m.LastLineTime = t
		}
		msg = line[h[1]:]
	} else if i := strings.Index(line, ") "); strings.HasPrefix(line, "(") && i > 0 && strings.Contains(line[:i], " pid=") {
		msg = line[i+2:]
	}
	switch {
	case strings.Contains(msg, "Application startup complete."):
		s.sawStartup, s.appStarted = true, at
	case strings.Contains(msg, "server is listening on"):
		if m := llamaListen.FindStringSubmatch(msg); m != nil {
			s.m.ListenURL = m[1]
		}
		s.m.Ready = true
	}
	if m := findWith(vllmListen, "Starting vLLM API server", msg); m != nil {
		s.m.ListenURL = m[1]
	}
	if m := findWith(vllmStats, "Avg prompt throughput: ", msg); m != nil {
		ev := Event{Time: at, Kind: KindDecode}
		if m[1] != "" {
			n, _ := strconv.Atoi(m[1])
			ev.Rank = "DP" + strconv.Itoa(n)
		}
		ev.InputThroughput = float(m[2])
		ev.GenThroughput = float(m[3])
		ev.RunningReqs = integer(m[4])
		ev.QueueReqs = integer(m[5])
		if u := float(m[6]); u != nil {
			*u /= 100
			ev.TokenUsage = u
		}
		s.m.Apply(ev)
		if h := float(m[7]); h != nil {
			*h /= 100
			s.m.CacheHitRate = h
		}
	}
	if m := findWith(vllmSpec, "SpecDecoding metrics: ", msg); m != nil {
		s.m.AcceptLen = float(m[1])
		if r := float(m[2]); r != nil {
			*r /= 100
			s.m.AcceptRate = r
		}
	}
	if m := findWith(llamaTiming, "eval time =", msg); m != nil {
		if m[1] != "" {
			s.m.InputThroughput = float(m[2])
		} else {
			s.m.GenThroughput = float(m[2])
		}
	}
}

// findWith is re's submatches in msg, looked for only when msg holds lit, a literal every
// match of re holds: an unanchored regexp tried on every line was four fifths of a log's
// scan (10 MB/s, minutes for a month's log; 47 MB/s with the literals first).
func findWith(re *regexp.Regexp, lit, msg string) []string {
	if !strings.Contains(msg, lit) {
		return nil
	}
	return re.FindStringSubmatch(msg)
}

func (s *scanner) result() Metrics {
	s.m.Phases = s.phases.marks(s.votes.winner())
	if s.votes.winner() == VLLM {
		// uvicorn's startup line: for SGLang it comes before the warm-up and
		// means nothing; for vLLM the engine is up by then.
		if s.sawStartup {
			s.m.Ready, s.m.ReadyAt = true, s.appStarted
		}
	}
	return s.m
}

// ScanMetrics reads a whole log of any of the three engines and returns the
// latest serving state it shows (see Metrics). It stops with ctx's
// error when ctx is done.
func ScanMetrics(ctx context.Context, r io.Reader) (Metrics, error) {
	s := NewScanner(time.Local, time.Now())
	err := scanLines(ctx, r, s.Line)
	return s.Metrics(), err
}

// Scanner folds a log's lines into Metrics as they come, for a reader that follows a
// growing log (a liveness watch reads only what a generation's log grew by since its
// last look) instead of reading the whole file again.
type Scanner struct{ s scanner }

// NewScanner starts a scanner; vLLM's month-day times take their year from now.
func NewScanner(loc *time.Location, now time.Time) *Scanner {
	return &Scanner{s: scanner{votes: tally{}, loc: loc, now: now, phases: newPhaseScan(loc, now)}}
}

// SetNow sets the time that vLLM's month-day times of the lines to come take their year
// from: a scanner that follows a log for days reads each line near its own now (a
// scanner started in the morning took a line of the afternoon for last year's).
func (s *Scanner) SetNow(now time.Time) { s.s.now, s.s.phases.now = now, now }

// Line folds one line (its newline optional).
func (s *Scanner) Line(raw string) { s.s.line(raw) }

// Metrics is the serving state the lines so far show.
func (s *Scanner) Metrics() Metrics { return s.s.result() }

// Dialect names the engine the lines so far come from; ok is false while no line said
// (a server that is no engine the agent knows: a static file server, a script).
func (s *Scanner) Dialect() (d Dialect, ok bool) {
	return s.s.votes.winner(), len(s.s.votes) > 0
}

func float(s string) *float64 {
	if s == "" {
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return nil
	}
	return &f
}

func integer(s string) *int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return nil
	}
	return &n
}
