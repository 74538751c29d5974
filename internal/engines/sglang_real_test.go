package engines

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// realLog is one file of testdata/real: the lines SGLang printed, and for
// each the URL (or source file) it was copied from.
type realLog struct {
	name    string
	lines   []string
	sources []string // per line
}

func readReal(t *testing.T, pattern string) []realLog {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "real", pattern))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no testdata/real/%s: %v", pattern, err)
	}
	var logs []realLog
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		l := realLog{name: filepath.Base(p)}
		source := ""
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, "# "); ok {
				if strings.HasPrefix(rest, "source: ") || strings.Contains(rest, "(built from source") {
					source = rest
				}
				continue
			}
			if source == "" {
				t.Fatalf("%s: line %q comes before any source", l.name, line)
			}
			l.lines = append(l.lines, line)
			l.sources = append(l.sources, source)
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		logs = append(logs, l)
	}
	return logs
}

// Every Prefill/Decode batch line real servers printed parses, with its
// prefix, its kind and the figures every such line carries.
func TestRealBatchLines(t *testing.T) {
	t.Parallel()
	n := 0
	for _, l := range readReal(t, "batch-*.log") {
		for i, line := range l.lines {
			if !strings.Contains(line, " batch") || !strings.Contains(line, "#running-req") {
				if _, ok := ParseLine(line); ok {
					t.Errorf("%s: %q parsed as a batch line", l.name, line)
				}
				continue
			}
			n++
			p, _, ok := SplitPrefix(line, time.UTC)
			if !ok {
				t.Errorf("%s (%s): prefix of %q not read", l.name, l.sources[i], line)
			}
			ev, ok := ParseLineIn(line, time.UTC)
			if !ok {
				t.Errorf("%s (%s): %q not parsed", l.name, l.sources[i], line)
				continue
			}
			if ev.RunningReqs == nil || ev.QueueReqs == nil || ev.Rank != p.Rank || !ev.Time.Equal(p.Time) {
				t.Errorf("%s (%s): %q parsed as %+v", l.name, l.sources[i], line, ev)
			}
			if ev.TokenUsage == nil && ev.FullTokenUsage == nil {
				t.Errorf("%s: %q: no token usage", l.name, line)
			}
			if ev.Kind == KindDecode && ev.GenThroughput == nil {
				t.Errorf("%s: %q: decode without throughput", l.name, line)
			}
			if strings.Contains(line, "graph: ") && ev.CUDAGraph == nil {
				t.Errorf("%s: %q: graph flag not read", l.name, line)
			}
			if strings.Contains(line, "mamba usage") && ev.MambaUsage == nil {
				t.Errorf("%s: %q: mamba usage not read", l.name, line)
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d batch lines in the corpus", n)
	}
}

// A 2024 line has a clock time without a date: it is placed on the latest
// day that puts it not after now.
func TestDatelessPrefix(t *testing.T) {
	t.Parallel()
	loc := time.FixedZone("X", 3600)
	now := time.Date(2026, 5, 9, 4, 41, 0, 0, loc)
	p, msg, ok := splitPrefixAt("[04:40:55 TP0] Decode batch. #running-req: 2", loc, now)
	if !ok || !p.Dateless || p.Rank != "TP0" || msg != "Decode batch. #running-req: 2" {
		t.Fatalf("got %+v %q %v", p, msg, ok)
	}
	if want := time.Date(2026, 5, 9, 4, 40, 55, 0, loc); !p.Time.Equal(want) {
		t.Errorf("time %v, want %v", p.Time, want)
	}
	// Just after midnight, 23:59:58 is yesterday's.
	now = time.Date(2026, 5, 9, 0, 0, 10, 0, loc)
	p, _, _ = splitPrefixAt("[23:59:58 TP0] x", loc, now)
	if want := time.Date(2026, 5, 8, 23, 59, 58, 0, loc); !p.Time.Equal(want) {
		t.Errorf("time %v, want %v", p.Time, want)
	}
	if n, ok := (Prefix{Rank: "DP3 PP1 TP12 EP12"}).RankNumber("TP"); !ok || n != 12 {
		t.Errorf("TP = %d %v", n, ok)
	}
	if _, ok := (Prefix{Rank: "MOE_DP1 TP0"}).RankNumber("DP"); ok {
		t.Error("MOE_DP read as DP")
	}
}

// A prefill line's "cuda graph: False" (prefill runs eager unless piecewise
// graphs are on) must not hide that decode runs as a CUDA graph.
func TestPrefillGraphFlagDoesNotOverwriteDecode(t *testing.T) {
	t.Parallel()
	var m Metrics
	m.UpdateIn("[2026-04-05 20:02:51] Decode batch, #running-req: 32, #token: 11179, token usage: 0.08, cuda graph: True, gen throughput (token/s): 1635.11, #queue-req: 0", time.UTC)
	m.UpdateIn("[2026-04-05 20:02:52] Prefill batch, #new-seq: 1, #new-token: 158, #cached-token: 0, token usage: 0.08, #running-req: 31, #queue-req: 0, cuda graph: False, input throughput (token/s): 559.53", time.UTC)
	if m.CUDAGraph == nil || !*m.CUDAGraph {
		t.Errorf("cuda graph = %v, want true (from decode)", m.CUDAGraph)
	}
	if m.InputThroughput == nil || *m.InputThroughput != 559.53 || *m.RunningReqs != 31 {
		t.Errorf("prefill figures lost: %+v", m)
	}
	m.UpdateIn("[2026-04-05 20:02:53 TP0] Decode batch, #running-req: 1, #token: 1, token usage: 0.00, npu graph: False, gen throughput (token/s): 1.00, #queue-req: 0", time.UTC)
	if m.CUDAGraph == nil || *m.CUDAGraph {
		t.Errorf("a decode line's npu graph: False not taken")
	}
}

// With DP attention every DP rank logs its own decode line: the server's
// throughput is the sum over the ranks, not the last rank's line.
func TestDPRanksAddUp(t *testing.T) {
	t.Parallel()
	logs := readReal(t, "batch-dp-attention.log")
	var m Metrics
	for _, line := range logs[0].lines[:5] { // the five ranks of PR 6081
		m.UpdateIn(line, time.UTC)
	}
	want := 171.01 + 168.28 + 173.06 + 155.80 + 152.08
	if m.GenThroughput == nil || abs(*m.GenThroughput-want) > 1e-6 {
		t.Errorf("gen throughput = %v, want %.2f", m.GenThroughput, want)
	}
	if m.RunningReqs == nil || *m.RunningReqs != 40 {
		t.Errorf("running = %v, want 40", m.RunningReqs)
	}
	if m.TokenUsage == nil || *m.TokenUsage != 0.13 {
		t.Errorf("token usage = %v, want the fullest rank's 0.13", m.TokenUsage)
	}
	// A rank silent for longer than rankStale no longer counts.
	m.UpdateIn("[2025-05-31 18:33:25 DP0 TP0] Decode batch. #running-req: 1, #token: 1, token usage: 0.01, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0", time.UTC)
	if *m.GenThroughput != 10 {
		t.Errorf("gen throughput = %v, want 10 (other ranks stale)", *m.GenThroughput)
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// Each real failure tail names its kind.
func TestRealFailures(t *testing.T) {
	t.Parallel()
	for _, l := range readReal(t, "failure-*.log") {
		kind := strings.TrimPrefix(strings.TrimSuffix(l.name, ".log"), "failure-")
		f, ok := DetectFailure(l.lines)
		if !ok {
			t.Errorf("%s (%s): no failure found", l.name, l.sources[0])
			continue
		}
		if !strings.HasPrefix(kind, string(f.Kind)) {
			t.Errorf("%s: kind %q, want the prefix of %q (%s)", l.name, f.Kind, kind, f)
		}
		if f.Hint == "" || f.Line == "" {
			t.Errorf("%s: %+v", l.name, f)
		}
	}
}

// The whole corpus goes through ScanMetrics without error and yields the
// figures of its last lines.
func TestRealScan(t *testing.T) {
	t.Parallel()
	for _, l := range readReal(t, "batch-*.log") {
		m, err := ScanMetrics(context.Background(), strings.NewReader(strings.Join(l.lines, "\n")))
		if err != nil || m.Events == 0 || m.GenThroughput == nil {
			t.Errorf("%s: %+v, %v", l.name, m, err)
		}
	}
}

// With DP attention, /metrics has one series per dp_rank: generation
// throughput and requests add up, usage is the fullest rank's; speculative
// decoding exported as 0 means off, not an accept rate of 0.
func TestRealPrometheus(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("testdata", "real", "metrics-dp-attention.txt"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParsePrometheus(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if m.GenThroughput == nil || abs(*m.GenThroughput-(171.01+168.28)) > 1e-9 {
		t.Errorf("gen throughput = %v, want the sum over dp_rank", m.GenThroughput)
	}
	if m.RunningReqs == nil || *m.RunningReqs != 14 || m.QueueReqs == nil || *m.QueueReqs != 1 {
		t.Errorf("requests = %v %v, want 14 and 1", m.RunningReqs, m.QueueReqs)
	}
	if m.TokenUsage == nil || *m.TokenUsage != 0.21 {
		t.Errorf("token usage = %v, want 0.21", m.TokenUsage)
	}
	if m.AcceptLen != nil || m.AcceptRate != nil {
		t.Errorf("spec exported as 0 read as %v/%v, want nil (no speculative decoding)", m.AcceptLen, m.AcceptRate)
	}
	if m.PromptTokens == nil || *m.PromptTokens != 1234 {
		t.Errorf("prompt tokens = %v", m.PromptTokens)
	}
	// Tensor parallel without DP: every TP rank repeats the figure, rank 0 speaks.
	tp := `sglang:gen_throughput{tp_rank="1",pp_rank="0"} 50
sglang:gen_throughput{tp_rank="0",pp_rank="0"} 60.47
sglang:spec_accept_length{tp_rank="0",pp_rank="0"} 3.88
sglang:spec_accept_rate{tp_rank="0",pp_rank="0"} 0.97
`
	m, err = ParsePrometheus(tp)
	if err != nil || *m.GenThroughput != 60.47 || m.AcceptLen == nil || *m.AcceptRate != 0.97 {
		t.Errorf("tp: %+v %v", m, err)
	}
}

// A failure found in a Python traceback is quoted by the exception that was raised,
// never by the source line that raised it (`raise RuntimeError(f"NCCL error: …")`).
func TestRealFailureQuotesTheException(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"failure-nccl.log":                   "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
		"failure-nccl-vllm.log":              "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
		"failure-port-in-use-rpc-port.log":   "ValueError: rpc_port at 30235 is not available in 30 seconds.",
		"failure-bad-flag-launch-server.log": "",
	}
	for _, l := range readReal(t, "failure-*.log") {
		f, ok := DetectFailure(l.lines)
		if !ok {
			t.Errorf("%s: no failure found", l.name)
			continue
		}
		if strings.Contains(f.Line, "raise ") || strings.Contains(f.Line, "{") {
			t.Errorf("%s: quoted the source line %q, want the exception", l.name, f.Line)
		}
		if w, ok := want[l.name]; ok && !strings.HasPrefix(f.Line, w) {
			t.Errorf("%s: quote %q, want %q", l.name, f.Line, w)
		}
	}
}
