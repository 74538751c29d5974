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
// it shows. With tensor parallelism every rank exports its own series; the
// tp_rank="0" series wins, else the first one. Malformed lines are skipped:
// a scrape is evidence, not a contract.
func ParsePrometheus(text string) (Metrics, error) {
	samples := ParseExposition(text)
	chosen := map[string]Sample{}
	for _, s := range samples {
		if !strings.HasPrefix(s.Name, "sglang:") {
			continue
		}
		prev, seen := chosen[s.Name]
		if !seen || (prev.Labels["tp_rank"] != "0" && s.Labels["tp_rank"] == "0") {
			chosen[s.Name] = s
		}
	}
	if len(chosen) == 0 {
		return Metrics{}, fmt.Errorf("parse sglang metrics: %w", ErrNoSGLangMetrics)
	}
	var m Metrics
	get := func(name string) (float64, bool) {
		s, ok := chosen[name]
		if !ok || math.IsNaN(s.Value) {
			return 0, false
		}
		return s.Value, true
	}
	setI := func(dst **int, name string) {
		if v, ok := get(name); ok && !math.IsInf(v, 0) && math.Abs(v) < 1<<53 {
			n := int(v)
			*dst = &n
		}
	}
	setF := func(dst **float64, name string) {
		if v, ok := get(name); ok {
			*dst = &v
		}
	}
	setI(&m.RunningReqs, MetricRunningReqs)
	setI(&m.QueueReqs, MetricQueueReqs)
	setI(&m.Tokens, MetricUsedTokens)
	setF(&m.TokenUsage, MetricTokenUsage)
	setF(&m.MambaUsage, MetricMambaUsage)
	setF(&m.SWATokenUsage, MetricSWATokenUsage)
	setF(&m.GenThroughput, MetricGenThroughput)
	setF(&m.CacheHitRate, MetricCacheHitRate)
	setF(&m.AcceptLen, MetricSpecAcceptLength)
	setF(&m.AcceptRate, MetricSpecAcceptRate)
	setF(&m.PromptTokens, MetricPromptTokens)
	setF(&m.GenerationTokens, MetricGenerationTokens)
	setF(&m.Requests, MetricRequests)
	return m, nil
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
