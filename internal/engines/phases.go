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

// StartPhases reads the phases of one launch from its log's lines (this generation's
// log only: a phase of an earlier launch must not be read as this one's), in loc, for
// a log read at now (vLLM's times have no year). Each phase is marked at the first line
// that ends it; every rank logs its own, and the first is when the phase ended for the
// launch's first rank. A phase the log does not show is missing from the result, which
// is in start order.
func StartPhases(lines []string, loc *time.Location, now time.Time) []PhaseMark {
	if loc == nil {
		loc = time.Local
	}
	rules := phaseLines[Sniff(lines)]
	seen := map[Phase]PhaseMark{}
	var last time.Time
	for _, raw := range lines {
		line := clean(raw)
		at, msg, ok := lineTime(line, loc, now)
		if ok {
			last = at
		}
		for _, r := range rules {
			if _, done := seen[r.phase]; done || !r.match(msg) {
				continue
			}
			if ok {
				seen[r.phase] = PhaseMark{Phase: r.phase, At: at}
			} else if !last.IsZero() {
				seen[r.phase] = PhaseMark{Phase: r.phase, At: last, Estimated: true}
			}
		}
	}
	var out []PhaseMark
	for _, p := range Phases {
		if m, ok := seen[p]; ok {
			out = append(out, m)
		}
	}
	return out
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
