package engines

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Metrics is the latest serving state an engine showed, in any dialect: over a
// log (ScanMetrics, or Update line by line for SGLang's) or in one /metrics
// scrape (ParsePrometheus). A nil field was never reported. The zero value is
// ready to use; it is not safe for concurrent use.
type Metrics struct {
	RunningReqs     *int
	QueueReqs       *int
	Tokens          *int     // #token, or #full token on hybrid models
	TokenUsage      *float64 // token usage, or full token usage on hybrid models
	MambaUsage      *float64
	SWATokenUsage   *float64
	AcceptLen       *float64
	AcceptRate      *float64
	CUDAGraph       *bool
	GenThroughput   *float64
	InputThroughput *float64

	// From /metrics (and vLLM's stats lines for the hit rate): lifetime counters
	// and the prefix cache hit rate.
	CacheHitRate     *float64
	PromptTokens     *float64 // sglang:prompt_tokens_total, vllm:prompt_tokens_total, llamacpp:prompt_tokens_total
	GenerationTokens *float64 // sglang:generation_tokens_total, vllm:generation_tokens_total, llamacpp:tokens_predicted_total
	Requests         *float64 // sglang:num_requests_total, vllm:request_success_total

	// From logs only.
	Lines        int       // lines seen
	Events       int       // batch (SGLang) or stats (vLLM) lines seen
	LastLineTime time.Time // time of the newest prefixed line
	LastEvent    time.Time // time of the newest batch line
	Ready        bool      // the dialect's ReadyLine seen
	ReadyAt      time.Time
	ListenURL    string // from "Uvicorn running on http://...", or vLLM's and llama.cpp's own line
	// Phases are the start phases the log shows (StartPhases), read in the same pass.
	Phases []PhaseMark

	// ranks holds the latest decode figures of each data-parallel rank: with
	// DP attention every DP rank logs its own Decode batch lines, and the
	// server's throughput is their sum, not the last line's.
	ranks map[int]rankDecode
}

// rankDecode is one DP rank's latest decode line: its load figures (keepLoad).
type rankDecode struct {
	at   time.Time
	load Metrics
}

// rankStale is how old a DP rank's last decode line may be, next to the
// newest, and still count: an idle rank stops logging, and its last figure
// would inflate the sum for ever.
const rankStale = time.Minute

// Update folds one SGLang log line into m, reading its time as local time
// (ScanMetrics folds every dialect's).
func (m *Metrics) Update(line string) {
	m.UpdateIn(line, time.Local)
}

// UpdateIn is Update with the prefix time read in loc.
func (m *Metrics) UpdateIn(line string, loc *time.Location) {
	m.Lines++
	p, msg, ok := SplitPrefix(strings.TrimRight(line, "\r\n"), loc)
	if ok {
		m.LastLineTime = p.Time
	}
	if strings.Contains(msg, SGLangReadyLine) {
		m.Ready = true
		m.ReadyAt = p.Time
	}
	if i := strings.Index(msg, "Uvicorn running on "); i >= 0 {
		u := msg[i+len("Uvicorn running on "):]
		if sp := strings.IndexByte(u, ' '); sp >= 0 {
			u = u[:sp]
		}
		m.ListenURL = u
	}
	ev, ok := ParseLineIn(line, loc)
	if !ok {
		return
	}
	m.Apply(ev)
}

// Apply folds a parsed event into m: every field the event carries replaces
// the value m held.
func (m *Metrics) Apply(ev Event) {
	m.Events++
	if !ev.Time.IsZero() {
		m.LastEvent = ev.Time
	}
	m.keepLoad(ev)
	keepInt(&m.Tokens, ev.Tokens)
	keepInt(&m.Tokens, ev.FullTokens)
	keepFloat(&m.SWATokenUsage, ev.SWATokenUsage)
	keepFloat(&m.AcceptLen, ev.AcceptLen)
	keepFloat(&m.AcceptRate, ev.AcceptRate)
	// Only decode lines say whether decoding runs as a CUDA graph; a
	// prefill line's "cuda graph: False" is about prefill (captured only
	// with piecewise graphs) and must not hide what the decode lines said.
	if ev.CUDAGraph != nil && ev.Kind == KindDecode {
		b := *ev.CUDAGraph
		m.CUDAGraph = &b
	}
	keepFloat(&m.InputThroughput, ev.InputThroughput)
	if dp, ok := rankNumber(ev.Rank, "DP"); ok && ev.Kind == KindDecode {
		m.applyRank(dp, ev)
	}
}

// applyRank records a DP rank's decode line and replaces the server-wide
// figures with the sums (requests, throughput) and maxima (usage) over the
// ranks that logged recently.
func (m *Metrics) applyRank(dp int, ev Event) {
	if m.ranks == nil {
		m.ranks = map[int]rankDecode{}
	}
	r := m.ranks[dp]
	r.at = ev.Time
	r.load.keepLoad(ev)
	m.ranks[dp] = r
	if len(m.ranks) < 2 {
		return
	}
	var gen, usage, mamba float64
	var running, queue int
	var haveGen, haveRunning, haveQueue, haveUsage, haveMamba bool
	for _, r := range m.ranks {
		if !ev.Time.IsZero() && !r.at.IsZero() && ev.Time.Sub(r.at) > rankStale {
			continue
		}
		l := r.load
		if l.GenThroughput != nil {
			gen, haveGen = gen+*l.GenThroughput, true
		}
		if l.RunningReqs != nil {
			running, haveRunning = running+*l.RunningReqs, true
		}
		if l.QueueReqs != nil {
			queue, haveQueue = queue+*l.QueueReqs, true
		}
		if l.TokenUsage != nil && (!haveUsage || *l.TokenUsage > usage) {
			usage, haveUsage = *l.TokenUsage, true
		}
		if l.MambaUsage != nil && (!haveMamba || *l.MambaUsage > mamba) {
			mamba, haveMamba = *l.MambaUsage, true
		}
	}
	if haveGen {
		m.GenThroughput = &gen
	}
	if haveRunning {
		m.RunningReqs = &running
	}
	if haveQueue {
		m.QueueReqs = &queue
	}
	if haveUsage {
		m.TokenUsage = &usage
	}
	if haveMamba {
		m.MambaUsage = &mamba
	}
}

// keepLoad folds the load figures an event carries into m, each replacing the value m
// held: requests running and queued, token and mamba usage, generation throughput. They
// are the figures a server's DP ranks each log for their own batch (applyRank).
func (m *Metrics) keepLoad(ev Event) {
	keepInt(&m.RunningReqs, ev.RunningReqs)
	keepInt(&m.QueueReqs, ev.QueueReqs)
	keepFloat(&m.TokenUsage, ev.TokenUsage)
	keepFloat(&m.TokenUsage, ev.FullTokenUsage)
	keepFloat(&m.MambaUsage, ev.MambaUsage)
	keepFloat(&m.GenThroughput, ev.GenThroughput)
}

func keepInt(dst **int, v *int) {
	if v != nil {
		n := *v
		*dst = &n
	}
}

func keepFloat(dst **float64, v *float64) {
	if v != nil {
		f := *v
		*dst = &f
	}
}

// maxLine bounds one log line; SGLang's server_args line runs to a few KiB,
// tracebacks and tqdm bars can be long. Longer lines are skipped, not an error.
const maxLine = 1 << 20

// scanLines calls fn for every line of r, skipping lines longer than maxLine,
// and stops with ctx's error when ctx is done: the one log reader of every
// dialect.
func scanLines(ctx context.Context, r io.Reader, fn func(string)) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var long bool
	var buf []byte
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("scan server log: %w", err)
		}
		chunk, isPrefix, err := br.ReadLine()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("scan server log: %w", err)
		}
		if !long {
			buf = append(buf, chunk...)
			if len(buf) > maxLine {
				long, buf = true, buf[:0]
			}
		}
		if isPrefix {
			continue
		}
		if !long {
			fn(string(buf))
		}
		long, buf = false, buf[:0]
	}
}
