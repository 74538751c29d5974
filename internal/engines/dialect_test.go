package engines

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// readCorpus returns a testdata file's lines without its comments; every
// line must come after a comment naming its source.
func readCorpus(t *testing.T, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	sourced := false
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if strings.HasPrefix(l, "# source: ") || strings.HasPrefix(l, "# (") {
			sourced = true
			continue
		}
		if strings.HasPrefix(l, "#") && !strings.Contains(l, ":") {
			continue
		}
		if strings.HasPrefix(l, "# ") {
			continue
		}
		if !sourced {
			t.Fatalf("%s: %q before any source", name, l)
		}
		lines = append(lines, l)
	}
	return lines
}

func near(p *float64, want float64) bool { return p != nil && math.Abs(*p-want) < 1e-9 }

func TestSniff(t *testing.T) {
	t.Parallel()
	if d := Sniff(readCorpus(t, "vllm-stats.log")); d != VLLM {
		t.Errorf("vllm log: %s", d)
	}
	if d := Sniff(readCorpus(t, "llamacpp-serving.log")); d != LlamaCPP {
		t.Errorf("llama.cpp log: %s", d)
	}
	// An SGLang log that shows a line of the vLLM it imports stays SGLang.
	sg := []string{
		"INFO 03-06 10:05:08 [__init__.py:190] Automatically detected platform cuda.",
		"[2025-03-06 10:05:10 TP0] Load weight begin. avail mem=46.81 GB",
		"[2025-03-06 10:05:20 TP0] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=31.2 GB",
	}
	if d := Sniff(sg); d != SGLang {
		t.Errorf("sglang log: %s", d)
	}
	if d := Sniff(nil); d != SGLang {
		t.Errorf("empty: %s", d)
	}
}

func TestScanVLLM(t *testing.T) {
	t.Parallel()
	lines := readCorpus(t, "vllm-stats.log")
	m, err := ScanMetrics(context.Background(), strings.NewReader(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	// The last stats line is v0's (no engine number): 0.4 tokens/s, 2 running.
	if !near(m.GenThroughput, 0.4) || m.RunningReqs == nil || *m.RunningReqs != 2 || !near(m.TokenUsage, 0.006) {
		t.Errorf("stats: gen %v running %v usage %v", m.GenThroughput, m.RunningReqs, m.TokenUsage)
	}
	if !near(m.AcceptLen, 6.82) || !near(m.AcceptRate, 0.831) {
		t.Errorf("spec: %v %v", m.AcceptLen, m.AcceptRate)
	}
	if !m.Ready || m.ListenURL != "http://0.0.0.0:8000" || m.LastLineTime.IsZero() {
		t.Errorf("ready %v url %q last %v", m.Ready, m.ListenURL, m.LastLineTime)
	}
	// The v1 engine line alone.
	m, _ = ScanMetrics(context.Background(), strings.NewReader(lines[1]))
	if !near(m.GenThroughput, 8.7) || *m.QueueReqs != 206 || !near(m.InputThroughput, 29400.6) || !near(m.CacheHitRate, 0) {
		t.Errorf("v1 line: %+v", m)
	}
}

// SGLang prints uvicorn's "Application startup complete." before its warm-up:
// in an SGLang log it does not mean ready.
func TestStartupLineIsNotReadyForSGLang(t *testing.T) {
	t.Parallel()
	log := "[2026-05-01 12:00:00 TP0] Load weight end.\n[2026-05-01 12:00:09] INFO:     Application startup complete.\n"
	m, err := ScanMetrics(context.Background(), strings.NewReader(log))
	if err != nil || m.Ready {
		t.Errorf("ready = %v, %v; want not ready before the fired-up line", m.Ready, err)
	}
	m, _ = ScanMetrics(context.Background(), strings.NewReader(log+"[2026-05-01 12:00:12] The server is fired up and ready to roll!\n"))
	if !m.Ready {
		t.Error("fired-up line not seen")
	}
}

func TestScanLlamaCPP(t *testing.T) {
	t.Parallel()
	m, err := ScanMetrics(context.Background(), strings.NewReader(strings.Join(readCorpus(t, "llamacpp-serving.log"), "\n")))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Ready || m.ListenURL != "http://0.0.0.0:8080" || !near(m.GenThroughput, 23.72) || !near(m.InputThroughput, 1.0) {
		t.Errorf("%+v", m)
	}
}

func TestDetectFailureDialects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file string
		kind FailureKind
		hint string
	}{
		{"failure-vllm-oom-kv.log", FailureOOM, "--gpu-memory-utilization"},
		{"failure-vllm-oom-free.log", FailureOOM, "another process"},
		{"failure-vllm-engine-crash.log", FailureEngineCrash, "traceback above"},
		{"failure-vllm-bad-flag.log", FailureBadFlag, "argparse"},
		{"failure-llamacpp-model-path.log", FailureModelPath, "unknown model architecture"},
		{"failure-llamacpp-port-in-use.log", FailurePortInUse, "--port"},
		{"failure-llamacpp-oom.log", FailureOOM, "-ngl"},
	}
	for _, tt := range tests {
		f, ok := DetectFailure(readCorpus(t, tt.file))
		if !ok || f.Kind != tt.kind || !strings.Contains(f.Hint, tt.hint) || f.Line == "" {
			t.Errorf("%s: %+v %v; want %s with %q in the hint", tt.file, f, ok, tt.kind, tt.hint)
		}
	}
	// SGLang's own failures still come through.
	f, ok := DetectFailure([]string{"[2026-05-01 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."})
	if !ok || f.Kind != FailureOOM || !strings.Contains(f.Hint, "--mem-fraction-static") {
		t.Errorf("sglang: %+v", f)
	}
}

func TestParsePrometheusDialects(t *testing.T) {
	t.Parallel()
	b, _ := os.ReadFile(filepath.Join("testdata", "metrics-vllm.txt"))
	m, err := ParsePrometheus(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if *m.RunningReqs != 5 || *m.QueueReqs != 1 || !near(m.GenerationTokens, 1500) || !near(m.Requests, 8) || !near(m.CacheHitRate, 0) {
		t.Errorf("vllm: %+v", m)
	}
	if !near(m.AcceptLen, 3.4) || !near(m.AcceptRate, 0.8) || !near(m.TokenUsage, 9.75010481363281e-06) {
		t.Errorf("vllm spec/usage: %v %v %v", m.AcceptLen, m.AcceptRate, m.TokenUsage)
	}
	b, _ = os.ReadFile(filepath.Join("testdata", "metrics-llamacpp.txt"))
	m, err = ParsePrometheus(string(b))
	if err != nil || !near(m.PromptTokens, 6886) || !near(m.GenerationTokens, 3469) || !near(m.GenThroughput, 23.72) || *m.RunningReqs != 1 {
		t.Errorf("llama.cpp: %+v %v", m, err)
	}
	if m.AcceptLen != nil {
		t.Error("llama.cpp without speculative counters has an accept length")
	}
	if _, err := ParsePrometheus("go_goroutines 8\n"); err == nil {
		t.Error("no engine metrics: no error")
	}
	if m, err := ParsePrometheus(`sglang:gen_throughput{tp_rank="0"} 60.47`); err != nil || !near(m.GenThroughput, 60.47) {
		t.Errorf("sglang: %+v %v", m, err)
	}
}

func TestStamp(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	if ts, ok := stamp("12-31 23:59:00", time.UTC, now); !ok || ts.Year() != 2025 {
		t.Errorf("%v %v", ts, ok)
	}
	if ts, ok := stamp("01-01 10:00:00", time.UTC, now); !ok || ts.Year() != 2026 {
		t.Errorf("%v %v", ts, ok)
	}
}

func FuzzScan(f *testing.F) {
	for _, name := range []string{"vllm-stats.log", "llamacpp-serving.log", "failure-vllm-oom-kv.log"} {
		b, _ := os.ReadFile(filepath.Join("testdata", name))
		for _, l := range strings.Split(string(b), "\n") {
			f.Add(l)
		}
	}
	f.Fuzz(func(t *testing.T, line string) {
		if _, err := ScanMetrics(context.Background(), strings.NewReader(line)); err != nil {
			t.Fatal(err)
		}
		DetectFailure([]string{line, line})
		ParsePrometheus(line)
		Sniff([]string{line})
	})
}
