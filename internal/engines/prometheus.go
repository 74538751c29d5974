package engines

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ErrNoMetrics is returned by ParsePrometheus when the exposition has no
// series of any known engine: the server runs without metrics (SGLang's
// --enable-metrics, llama.cpp's --metrics), or the port answers for something
// else.
var ErrNoMetrics = errors.New("no sglang:, vllm: or llamacpp: metrics in exposition")

// ParsePrometheus reads a /metrics exposition of SGLang (sglang:), vLLM
// (vllm:) or llama.cpp (llamacpp:) and returns the serving state it shows.
func ParsePrometheus(text string) (Metrics, error) {
	switch {
	case strings.Contains(text, "sglang:"):
		return sglangPrometheus(parseExposition(text))
	case strings.Contains(text, "vllm:"):
		return vllmPrometheus(parseExposition(text))
	case strings.Contains(text, "llamacpp:"):
		return llamaPrometheus(parseExposition(text))
	}
	return Metrics{}, fmt.Errorf("parse metrics: %w", ErrNoMetrics)
}

// totals sums each series name over its labels (vLLM labels every series
// with engine and model_name, counters also with finished_reason and such)
// and keeps the maximum for the names in peak.
func totals(samples []sample, prefix string, peak ...string) figures {
	out := figures{}
	for _, s := range samples {
		if !strings.HasPrefix(s.Name, prefix) || math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			continue
		}
		prev, seen := out[s.Name]
		switch {
		case !seen:
			out[s.Name] = s.Value
		case slices.Contains(peak, s.Name):
			out[s.Name] = math.Max(prev, s.Value)
		default:
			out[s.Name] = prev + s.Value
		}
	}
	return out
}

// figures are an exposition's series totalled by name (totals).
type figures map[string]float64

// number is the named figure; nil when the exposition has no such series.
func (t figures) number(name string) *float64 {
	if v, ok := t[name]; ok {
		return &v
	}
	return nil
}

// count is the named figure as a count; nil when the exposition has no such series or
// its value is past what a float64 holds exactly.
func (t figures) count(name string) *int {
	if v, ok := t[name]; ok && math.Abs(v) < 1<<53 {
		n := int(v)
		return &n
	}
	return nil
}

// vLLM's metric names (vllm/v1/metrics/loggers.py; v0's in brackets).
const (
	VLLMRunning         = "vllm:num_requests_running"
	VLLMWaiting         = "vllm:num_requests_waiting"
	VLLMKVUsage         = "vllm:kv_cache_usage_perc"  // 0..1 despite the name
	VLLMGPUCacheUsage   = "vllm:gpu_cache_usage_perc" // v0
	VLLMPromptTokens    = "vllm:prompt_tokens_total"
	VLLMGenTokens       = "vllm:generation_tokens_total"
	VLLMRequests        = "vllm:request_success_total"
	VLLMGenThroughput   = "vllm:avg_generation_throughput_toks_per_s" // v0
	VLLMPrefixHits      = "vllm:prefix_cache_hits_total"
	VLLMPrefixQueries   = "vllm:prefix_cache_queries_total"
	VLLMSpecDrafts      = "vllm:spec_decode_num_drafts_total"
	VLLMSpecDraftTokens = "vllm:spec_decode_num_draft_tokens_total"
	VLLMSpecAccepted    = "vllm:spec_decode_num_accepted_tokens_total"
)

func vllmPrometheus(samples []sample) (Metrics, error) {
	t := totals(samples, "vllm:", VLLMKVUsage, VLLMGPUCacheUsage)
	if len(t) == 0 {
		return Metrics{}, fmt.Errorf("parse vllm metrics: %w", ErrNoMetrics)
	}
	var m Metrics
	m.RunningReqs = t.count(VLLMRunning)
	m.QueueReqs = t.count(VLLMWaiting)
	m.TokenUsage = t.number(VLLMKVUsage)
	if m.TokenUsage == nil {
		m.TokenUsage = t.number(VLLMGPUCacheUsage)
	}
	m.PromptTokens = t.number(VLLMPromptTokens)
	m.GenerationTokens = t.number(VLLMGenTokens)
	m.Requests = t.number(VLLMRequests)
	m.GenThroughput = t.number(VLLMGenThroughput)
	if q := t[VLLMPrefixQueries]; q > 0 {
		r := t[VLLMPrefixHits] / q
		m.CacheHitRate = &r
	}
	// Speculative decoding: counters exist only when it is on, and mean
	// nothing before the first draft.
	if d, dt := t[VLLMSpecDrafts], t[VLLMSpecDraftTokens]; d > 0 && dt > 0 {
		l := 1 + t[VLLMSpecAccepted]/d
		r := t[VLLMSpecAccepted] / dt
		m.AcceptLen, m.AcceptRate = &l, &r
	}
	return m, nil
}

// llama.cpp's metric names (tools/server, with --metrics).
const (
	LlamaPromptTokens   = "llamacpp:prompt_tokens_total"
	LlamaPredicted      = "llamacpp:tokens_predicted_total"
	LlamaPredictedRate  = "llamacpp:predicted_tokens_seconds"
	LlamaPromptRate     = "llamacpp:prompt_tokens_seconds"
	LlamaProcessing     = "llamacpp:requests_processing"
	LlamaDeferred       = "llamacpp:requests_deferred"
	LlamaKVUsage        = "llamacpp:kv_cache_usage_ratio" // removed in 2025 builds
	LlamaKVTokens       = "llamacpp:kv_cache_tokens"      // removed in 2025 builds
	LlamaDecodeRequests = "llamacpp:n_decode_total"
)

func llamaPrometheus(samples []sample) (Metrics, error) {
	t := totals(samples, "llamacpp:")
	if len(t) == 0 {
		return Metrics{}, fmt.Errorf("parse llama.cpp metrics: %w", ErrNoMetrics)
	}
	return Metrics{
		PromptTokens:     t.number(LlamaPromptTokens),
		GenerationTokens: t.number(LlamaPredicted),
		GenThroughput:    t.number(LlamaPredictedRate),
		InputThroughput:  t.number(LlamaPromptRate),
		RunningReqs:      t.count(LlamaProcessing),
		QueueReqs:        t.count(LlamaDeferred),
		TokenUsage:       t.number(LlamaKVUsage),
		Tokens:           t.count(LlamaKVTokens),
	}, nil
}

// The SGLang metric names ParsePrometheus reads (SchedulerMetricsCollector
// and TokenizerMetricsCollector in python/sglang/srt/metrics/collector.py).
const (
	SGLangRunningReqs      = "sglang:num_running_reqs"
	SGLangQueueReqs        = "sglang:num_queue_reqs"
	SGLangUsedTokens       = "sglang:num_used_tokens"
	SGLangTokenUsage       = "sglang:token_usage"
	SGLangMambaUsage       = "sglang:mamba_usage"
	SGLangSWATokenUsage    = "sglang:swa_token_usage"
	SGLangGenThroughput    = "sglang:gen_throughput"
	SGLangCacheHitRate     = "sglang:cache_hit_rate"
	SGLangSpecAcceptLength = "sglang:spec_accept_length"
	SGLangSpecAcceptRate   = "sglang:spec_accept_rate"
	SGLangPromptTokens     = "sglang:prompt_tokens_total"
	SGLangGenerationTokens = "sglang:generation_tokens_total"
	SGLangRequests         = "sglang:num_requests_total"
)

// sglangPrometheus reads SGLang's series and returns the serving state they
// show.
//
// Every scheduler exports its own series, labelled tp_rank, pp_rank,
// moe_ep_rank and, with DP attention, dp_rank. Within one DP rank the lowest
// (pp, tp, ep) series speaks for it (the others repeat it). Across DP ranks
// the figures combine: requests, tokens and generation throughput add up
// (each rank decodes its own batch), usages take the fullest rank, rates the
// mean. sglang:spec_accept_length and spec_accept_rate are exported as 0
// when speculative decoding is off (and before the first verify step): an
// accept length is at least 1 whenever it was measured, so 0 reads as "no
// speculative decoding", nil, never as an accept rate of 0.
func sglangPrometheus(samples []sample) (Metrics, error) {
	type pick struct {
		s   sample
		key [3]int
	}
	// name -> dp_rank -> the lead series of that rank.
	byName := map[string]map[string]pick{}
	for _, s := range samples {
		if !strings.HasPrefix(s.Name, "sglang:") || math.IsNaN(s.Value) {
			continue
		}
		ranks := byName[s.Name]
		if ranks == nil {
			ranks = map[string]pick{}
			byName[s.Name] = ranks
		}
		dp := s.Labels["dp_rank"]
		k := [3]int{rankLabel(s.Labels["pp_rank"]), rankLabel(s.Labels["tp_rank"]), rankLabel(s.Labels["moe_ep_rank"])}
		if prev, seen := ranks[dp]; !seen || less(k, prev.key) {
			ranks[dp] = pick{s, k}
		}
	}
	if len(byName) == 0 {
		return Metrics{}, fmt.Errorf("parse sglang metrics: %w", ErrNoMetrics)
	}
	combine := func(name string, how combiner) (float64, bool) {
		ranks, ok := byName[name]
		if !ok || len(ranks) == 0 {
			return 0, false
		}
		var v float64
		first := true
		for _, p := range ranks {
			x := p.s.Value
			switch {
			case first:
				v = x
			case how == sumOf:
				v += x
			case how == maxOf:
				v = math.Max(v, x)
			case how == meanOf:
				v += x
			}
			first = false
		}
		if how == meanOf {
			v /= float64(len(ranks))
		}
		return v, true
	}
	var m Metrics
	setI := func(dst **int, name string) {
		if v, ok := combine(name, sumOf); ok && !math.IsInf(v, 0) && math.Abs(v) < 1<<53 {
			n := int(v)
			*dst = &n
		}
	}
	setF := func(dst **float64, name string, how combiner) {
		if v, ok := combine(name, how); ok {
			*dst = &v
		}
	}
	setI(&m.RunningReqs, SGLangRunningReqs)
	setI(&m.QueueReqs, SGLangQueueReqs)
	setI(&m.Tokens, SGLangUsedTokens)
	setF(&m.TokenUsage, SGLangTokenUsage, maxOf)
	setF(&m.MambaUsage, SGLangMambaUsage, maxOf)
	setF(&m.SWATokenUsage, SGLangSWATokenUsage, maxOf)
	setF(&m.GenThroughput, SGLangGenThroughput, sumOf)
	setF(&m.CacheHitRate, SGLangCacheHitRate, meanOf)
	setF(&m.AcceptLen, SGLangSpecAcceptLength, meanOf)
	setF(&m.AcceptRate, SGLangSpecAcceptRate, meanOf)
	if m.AcceptLen == nil || *m.AcceptLen == 0 {
		m.AcceptLen, m.AcceptRate = nil, nil
	}
	setF(&m.PromptTokens, SGLangPromptTokens, sumOf)
	setF(&m.GenerationTokens, SGLangGenerationTokens, sumOf)
	setF(&m.Requests, SGLangRequests, sumOf)
	return m, nil
}

// combiner says how one figure of several DP ranks becomes the server's.
type combiner int

const (
	sumOf combiner = iota
	maxOf
	meanOf
)

// rankLabel reads a rank label; absent or malformed sorts first.
func rankLabel(v string) int {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// sample is one series of an exposition.
type sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// maxSkips bounds how many malformed lines parseExposition steps over before it
// keeps what it read.
const maxSkips = 16

// parseExposition parses the Prometheus text format with expfmt into samples.
// A malformed line is skipped, not fatal: a scrape is evidence, not a
// contract, so the line expfmt stops at is blanked and the text parsed again
// (at most maxSkips times; past that, what parsed before the error is kept).
// Histograms and summaries give their _sum and _count. It never panics.
func parseExposition(text string) []sample {
	lines := strings.Split(text, "\n")
	for skips := 0; ; skips++ {
		p := expfmt.NewTextParser(model.UTF8Validation)
		families, err := p.TextToMetricFamilies(strings.NewReader(strings.Join(lines, "\n") + "\n"))
		var perr expfmt.ParseError
		if err == nil || skips == maxSkips || !errors.As(err, &perr) || perr.Line < 1 || perr.Line > len(lines) || lines[perr.Line-1] == "" {
			return flatten(families)
		}
		lines[perr.Line-1] = ""
	}
}

// flatten turns expfmt's metric families into samples, in name order.
func flatten(families map[string]*dto.MetricFamily) []sample {
	var out []sample
	for _, name := range slices.Sorted(maps.Keys(families)) {
		for _, m := range families[name].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			add := func(name string, v float64) { out = append(out, sample{Name: name, Labels: labels, Value: v}) }
			switch {
			case m.Gauge != nil:
				add(name, m.GetGauge().GetValue())
			case m.Counter != nil:
				add(name, m.GetCounter().GetValue())
			case m.Untyped != nil:
				add(name, m.GetUntyped().GetValue())
			case m.Histogram != nil:
				add(name+"_sum", m.GetHistogram().GetSampleSum())
				add(name+"_count", float64(m.GetHistogram().GetSampleCount()))
			case m.Summary != nil:
				add(name+"_sum", m.GetSummary().GetSampleSum())
				add(name+"_count", float64(m.GetSummary().GetSampleCount()))
			}
		}
	}
	return out
}
