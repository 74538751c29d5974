package engines

import (
	"regexp"
	"strings"
	"time"
)

// Phase is one step of a launch's start that the engine's log shows. A slow start
// (ten minutes is common for a large model) says where its time went by its phases.
type Phase string

// The phases of a start, in the order engines go through them.
const (
	PhaseWeights    Phase = "weights_loaded"       // the checkpoint is on the GPUs
	PhaseKVCache    Phase = "kv_cache_allocated"   // the KV cache pool is sized and allocated
	PhaseCUDAGraphs Phase = "cuda_graphs_captured" // CUDA graphs captured (absent with --disable-cuda-graph / --enforce-eager)
	PhaseReady      Phase = "ready"                // the engine's ready line
)

// Phases lists the phases in start order (for views and metrics).
var Phases = []Phase{PhaseWeights, PhaseKVCache, PhaseCUDAGraphs, PhaseReady}

// PhaseMark is when a launch finished one phase, by its log's clock.
type PhaseMark struct {
	Phase Phase
	At    time.Time
	// Estimated is true when the line that ends the phase carries no time of its own
	// (uvicorn's "Application startup complete."): At is then the time of the newest
	// timed line before it.
	Estimated bool
}

// phaseLines are the lines that end a phase, per dialect: SGLang's scheduler lines
// (python/sglang/srt/model_executor/model_runner.py: "Load weight end.", "KV Cache is
// allocated.", "Capture cuda graph end."; the ready line of http_server.py) and
// vLLM's (v1 gpu_model_runner.py "Model loading took %.4f GiB and %.6f seconds", newer
// "Model loading took 55.22 GiB memory and 20.3s"; kv_cache_utils.py "GPU KV cache
// size: 49,152 tokens", v0 "# GPU blocks: N" / "# cuda blocks: N"; "Graph capturing
// finished in %.0f secs"; uvicorn's "Application startup complete."). llama.cpp has no
// separate phases worth showing: it is ready when its model is loaded.
var phaseLines = map[Dialect][]struct {
	phase Phase
	match func(msg string) bool
}{
	SGLang: {
		{PhaseWeights, contains("Load weight end.")},
		{PhaseKVCache, contains("KV Cache is allocated.", "Memory pool end.")},
		{PhaseCUDAGraphs, regexp.MustCompile(`^Capture (?:cuda|npu|cpu|musa) graph end\.`).MatchString},
		{PhaseReady, contains(SGLangReadyLine)},
	},
	VLLM: {
		{PhaseWeights, regexp.MustCompile(`^(?:Model loading took|Loading model weights took) `).MatchString},
		{PhaseKVCache, regexp.MustCompile(`^(?:GPU KV cache size: [\d,]+ tokens|# (?:GPU|cuda) blocks: \d+)`).MatchString},
		{PhaseCUDAGraphs, contains("Graph capturing finished in ")},
		{PhaseReady, contains(ReadyLine(VLLM))},
	},
	LlamaCPP: {
		{PhaseReady, contains(ReadyLine(LlamaCPP))},
	},
}

// phaseHints are words every line that ends a phase contains, in any dialect: a line
// without one is not parsed for its time (the fold of a whole log in ScanMetrics reads
// every line of a log that may be gigabytes).
var phaseHints = []string{
	"Load weight end.", "KV Cache is allocated.", "Memory pool end.", " graph end.", SGLangReadyLine,
	"Model loading took ", "Loading model weights took ", "KV cache size: ", " blocks: ", "Graph capturing finished in ",
	ReadyLine(VLLM), ReadyLine(LlamaCPP),
}

var mayEndPhase = contains(phaseHints...)

// phaseScan collects the phases a log shows, line by line, for every dialect at once:
// which dialect the log is in is known only at its end (Sniff's majority), and a log is
// read once.
type phaseScan struct {
	seen map[Dialect]map[Phase]PhaseMark
	loc  *time.Location
	now  time.Time
}

func newPhaseScan(loc *time.Location, now time.Time) *phaseScan {
	if loc == nil {
		loc = time.Local
	}
	return &phaseScan{seen: map[Dialect]map[Phase]PhaseMark{}, loc: loc, now: now}
}

// line looks at one cleaned line; last is the time of the newest line before it that
// had one (a phase ended by a line without a time is marked then, Estimated).
func (p *phaseScan) line(line string, last time.Time) {
	if !mayEndPhase(line) {
		return
	}
	at, msg, ok := lineTime(line, p.loc, p.now)
	for d, rules := range phaseLines {
		for _, r := range rules {
			if _, done := p.seen[d][r.phase]; done || !r.match(msg) {
				continue
			}
			if p.seen[d] == nil {
				p.seen[d] = map[Phase]PhaseMark{}
			}
			if ok {
				p.seen[d][r.phase] = PhaseMark{Phase: r.phase, At: at}
			} else if !last.IsZero() {
				p.seen[d][r.phase] = PhaseMark{Phase: r.phase, At: last, Estimated: true}
			}
		}
	}
}

// marks are the phases seen in dialect d's lines, in start order.
func (p *phaseScan) marks(d Dialect) []PhaseMark {
	var out []PhaseMark
	for _, ph := range Phases {
		if m, ok := p.seen[d][ph]; ok {
			out = append(out, m)
		}
	}
	return out
}

// StartPhases reads the phases of one launch from its log's lines (this generation's
// log only: a phase of an earlier launch must not be read as this one's), in loc, for
// a log read at now (vLLM's times have no year). Each phase is marked at the first line
// that ends it; every rank logs its own, and the first is when the phase ended for the
// launch's first rank. A phase the log does not show is missing from the result, which
// is in start order. ScanMetrics folds the same into Metrics.Phases while it reads a
// whole log.
func StartPhases(lines []string, loc *time.Location, now time.Time) []PhaseMark {
	p := newPhaseScan(loc, now)
	t := tally{}
	var last time.Time
	for _, raw := range lines {
		line := clean(raw)
		t.add(line)
		p.line(line, last)
		if at, _, ok := lineTime(line, p.loc, now); ok {
			last = at
		}
	}
	return p.marks(t.winner())
}

// lineTime returns a line's own time and its message without the prefix; ok is false
// for a line without a time (tracebacks, tqdm bars, uvicorn's bare INFO lines).
func lineTime(line string, loc *time.Location, now time.Time) (time.Time, string, bool) {
	if p, msg, ok := splitPrefixAt(line, loc, now); ok {
		return p.Time, strings.TrimSpace(msg), true
	}
	if m := vllmHead.FindStringSubmatchIndex(line); m != nil {
		if t, ok := stamp(line[m[6]:m[7]], loc, now); ok {
			return t, strings.TrimSpace(line[m[1]:]), true
		}
	}
	return time.Time{}, message(line), false
}
