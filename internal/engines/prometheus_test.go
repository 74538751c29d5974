package engines

import (
	"fmt"
	"testing"
)

// A malformed line costs that line, not the scrape: expfmt stops at the first
// error, parseExposition blanks the line and reads the rest.
func TestParseExpositionSkipsMalformedLines(t *testing.T) {
	t.Parallel()
	text := `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{tp_rank="0"} 3
this { is not a sample
sglang:num_queue_reqs{tp_rank="0"} one
sglang:num_queue_reqs{tp_rank="1"} 1
sglang:gen_throughput{tp_rank="0"} 60.47`
	m, err := ParsePrometheus(text)
	if err != nil {
		t.Fatal(err)
	}
	if m.RunningReqs == nil || *m.RunningReqs != 3 || m.QueueReqs == nil || *m.QueueReqs != 1 || m.GenThroughput == nil || *m.GenThroughput != 60.47 {
		t.Errorf("running %v, queue %v, gen %v: want 3, 1 and 60.47 around the malformed lines", m.RunningReqs, m.QueueReqs, m.GenThroughput)
	}
}

// Histograms and summaries give their _sum and _count, as the text shows them.
func TestParseExpositionHistogram(t *testing.T) {
	t.Parallel()
	s := parseExposition(`# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0"} 2
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 3
vllm:e2e_request_latency_seconds_sum 2.5
vllm:e2e_request_latency_seconds_count 3
`)
	got := map[string]float64{}
	for _, x := range s {
		got[x.Name] = x.Value
	}
	if len(s) != 2 || got["vllm:e2e_request_latency_seconds_sum"] != 2.5 || got["vllm:e2e_request_latency_seconds_count"] != 3 {
		t.Errorf("samples = %+v", s)
	}
}

// A count past what a float64 holds exactly is no count (nil), in every dialect that
// reads counts from its totals; the same series within range is one.
func TestParsePrometheusCountBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ text, name string }{
		{"vllm:num_requests_running{engine=\"0\"} %s\nvllm:num_requests_waiting{engine=\"0\"} 2\n", "vllm"},
		{"llamacpp:requests_processing %s\nllamacpp:requests_deferred 2\n", "llama.cpp"},
	} {
		for v, want := range map[string]int{"1e20": -1, "-1e16": -1, "7": 7} {
			m, err := ParsePrometheus(fmt.Sprintf(c.text, v))
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			switch {
			case m.QueueReqs == nil || *m.QueueReqs != 2:
				t.Errorf("%s: queue %v, want 2", c.name, m.QueueReqs)
			case want < 0 && m.RunningReqs != nil:
				t.Errorf("%s: running %s read as %d, want nil", c.name, v, *m.RunningReqs)
			case want >= 0 && (m.RunningReqs == nil || *m.RunningReqs != want):
				t.Errorf("%s: running %s read as %v, want %d", c.name, v, m.RunningReqs, want)
			}
		}
	}
}
