package sglang

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrNoSGLangMetrics is returned by ParsePrometheus when the exposition holds
// no sglang: series at all: the server runs without --enable-metrics, or the
// port answers for something else.
var ErrNoSGLangMetrics = errors.New("no sglang: metrics in exposition")

// The SGLang metric names ParsePrometheus reads (SchedulerMetricsCollector
// and TokenizerMetricsCollector in python/sglang/srt/metrics/collector.py).
const (
	MetricRunningReqs      = "sglang:num_running_reqs"
	MetricQueueReqs        = "sglang:num_queue_reqs"
	MetricUsedTokens       = "sglang:num_used_tokens"
	MetricTokenUsage       = "sglang:token_usage"
	MetricMambaUsage       = "sglang:mamba_usage"
	MetricSWATokenUsage    = "sglang:swa_token_usage"
	MetricGenThroughput    = "sglang:gen_throughput"
	MetricCacheHitRate     = "sglang:cache_hit_rate"
	MetricSpecAcceptLength = "sglang:spec_accept_length"
	MetricSpecAcceptRate   = "sglang:spec_accept_rate"
	MetricPromptTokens     = "sglang:prompt_tokens_total"
	MetricGenerationTokens = "sglang:generation_tokens_total"
	MetricRequests         = "sglang:num_requests_total"
)

// Sample is one series of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// ParsePrometheus reads SGLang's /metrics text and returns the serving state
// it shows. Malformed lines are skipped: a scrape is evidence, not a contract.
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
func ParsePrometheus(text string) (Metrics, error) {
	type pick struct {
		s   Sample
		key [3]int
	}
	// name -> dp_rank -> the lead series of that rank.
	byName := map[string]map[string]pick{}
	for _, s := range ParseExposition(text) {
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
		return Metrics{}, fmt.Errorf("parse sglang metrics: %w", ErrNoSGLangMetrics)
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
	setI(&m.RunningReqs, MetricRunningReqs)
	setI(&m.QueueReqs, MetricQueueReqs)
	setI(&m.Tokens, MetricUsedTokens)
	setF(&m.TokenUsage, MetricTokenUsage, maxOf)
	setF(&m.MambaUsage, MetricMambaUsage, maxOf)
	setF(&m.SWATokenUsage, MetricSWATokenUsage, maxOf)
	setF(&m.GenThroughput, MetricGenThroughput, sumOf)
	setF(&m.CacheHitRate, MetricCacheHitRate, meanOf)
	setF(&m.AcceptLen, MetricSpecAcceptLength, meanOf)
	setF(&m.AcceptRate, MetricSpecAcceptRate, meanOf)
	if m.AcceptLen == nil || *m.AcceptLen == 0 {
		m.AcceptLen, m.AcceptRate = nil, nil
	}
	setF(&m.PromptTokens, MetricPromptTokens, sumOf)
	setF(&m.GenerationTokens, MetricGenerationTokens, sumOf)
	setF(&m.Requests, MetricRequests, sumOf)
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

// ParseExposition parses the Prometheus text format into samples, skipping
// comments and malformed lines. It never panics.
func ParseExposition(text string) []Sample {
	var out []Sample
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if s, ok := parseSample(line); ok {
			out = append(out, s)
		}
	}
	return out
}

func parseSample(line string) (Sample, bool) {
	i := strings.IndexAny(line, "{ \t")
	if i <= 0 {
		return Sample{}, false
	}
	s := Sample{Name: line[:i]}
	rest := line[i:]
	if rest[0] == '{' {
		labels, n, ok := parseLabels(rest)
		if !ok {
			return Sample{}, false
		}
		s.Labels = labels
		rest = rest[n:]
	}
	fields := strings.Fields(rest)
	if len(fields) < 1 || len(fields) > 2 {
		return Sample{}, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return Sample{}, false
	}
	s.Value = v
	return s, true
}

// parseLabels parses `{a="x",b="y\"z"}` at the start of s and returns the
// labels and the number of bytes consumed.
func parseLabels(s string) (map[string]string, int, bool) {
	labels := map[string]string{}
	i := 1
	for {
		for i < len(s) && (s[i] == ' ' || s[i] == ',') {
			i++
		}
		if i >= len(s) {
			return nil, 0, false
		}
		if s[i] == '}' {
			return labels, i + 1, true
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq <= 0 {
			return nil, 0, false
		}
		name := strings.TrimSpace(s[i : i+eq])
		i += eq + 1
		if i >= len(s) || s[i] != '"' {
			return nil, 0, false
		}
		i++
		var b strings.Builder
		closed := false
		for i < len(s) {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				switch s[i+1] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i+1])
				}
				i += 2
				continue
			}
			i++
			if c == '"' {
				closed = true
				break
			}
			b.WriteByte(c)
		}
		if !closed {
			return nil, 0, false
		}
		labels[name] = b.String()
	}
}
