package engines

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func marks(ms []PhaseMark) string {
	var parts []string
	for _, m := range ms {
		s := fmt.Sprintf("%s@%s", m.Phase, m.At.Format("15:04:05"))
		if m.Estimated {
			s += "~"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// The phases real servers' logs show, each at the first line that ends it.
func TestRealStartPhases(t *testing.T) {
	t.Parallel()
	want := map[string]string{
		"startup-sglang-4826.log":         "weights_loaded@21:33:30 kv_cache_allocated@21:33:31",
		"startup-sglang-11830.log":        "kv_cache_allocated@12:50:10 cuda_graphs_captured@12:50:15",
		"startup-sglang-17157.log":        "weights_loaded@13:56:49 kv_cache_allocated@13:56:49",
		"startup-vllm-38820.log":          "weights_loaded@20:59:59",
		"startup-vllm-runai-67.log":       "kv_cache_allocated@11:03:18 cuda_graphs_captured@11:03:55",
		"startup-vllm-v0-gateway-550.log": "kv_cache_allocated@20:15:46",
	}
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	logs := readReal(t, "startup-*.log")
	if len(logs) != len(want) {
		t.Errorf("%d startup logs, %d expectations", len(logs), len(want))
	}
	for _, l := range logs {
		got := marks(StartPhases(l.lines, time.UTC, now))
		if got != want[l.name] {
			t.Errorf("%s (%s):\n got %s\nwant %s", l.name, l.sources[0], got, want[l.name])
		}
	}
}

// A whole start in the order SGLang prints it (built from source: model_runner.py,
// cuda_graph_runner.py, http_server.py; the lines the fake prints), and vLLM's, whose
// uvicorn ready line has no time of its own.
func TestStartPhasesWholeStart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	cases := []struct{ name, log, want string }{
		{"sglang", `[2026-12-03 10:00:00 TP0] Load weight begin. avail mem=46.92 GB
[2026-12-03 10:03:10 TP1] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=21.01 GB, mem usage=25.91 GB.
[2026-12-03 10:03:11 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=21.01 GB, mem usage=25.91 GB.
[2026-12-03 10:03:20 TP0] KV Cache is allocated. #tokens: 413696, K size: 3.16 GB, V size: 3.16 GB
[2026-12-03 10:03:21 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=6.09 GB
[2026-12-03 10:05:02 TP0] Capture cuda graph end. Time elapsed: 101.02 s. mem usage=0.31 GB. avail mem=5.67 GB.
[2026-12-03 10:05:30] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-12-03 10:05:40] The server is fired up and ready to roll!
[2026-12-03 10:05:41 TP0] Decode batch, #running-req: 1, #token: 40, token usage: 0.00, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0, `,
			"weights_loaded@10:03:10 kv_cache_allocated@10:03:20 cuda_graphs_captured@10:05:02 ready@10:05:40"},
		{"sglang without cuda graphs", `[2026-12-03 10:03:11 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=21.01 GB, mem usage=25.91 GB.
[2026-12-03 10:03:20 TP0] KV Cache is allocated. #tokens: 413696, K size: 3.16 GB, V size: 3.16 GB
[2026-12-03 10:05:40] The server is fired up and ready to roll!`,
			"weights_loaded@10:03:11 kv_cache_allocated@10:03:20 ready@10:05:40"},
		{"vllm", `(EngineCore_DP0 pid=441) INFO 12-03 11:43:54 [gpu_model_runner.py:3341] Model loading took 2.0513 GiB memory and 27.200487 seconds
(EngineCore_DP0 pid=441) INFO 12-03 11:44:18 [kv_cache_utils.py:1234] GPU KV cache size: 1,587,648 tokens
(EngineCore_DP0 pid=441) INFO 12-03 11:44:21 [gpu_model_runner.py:3480] Graph capturing finished in 3 secs, took 0.31 GiB
(APIServer pid=440) INFO 12-03 11:44:25 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=440) INFO:     Application startup complete.`,
			"weights_loaded@11:43:54 kv_cache_allocated@11:44:18 cuda_graphs_captured@11:44:21 ready@11:44:25~"},
		{"nothing yet", `[2026-12-03 10:00:00 TP0] Load weight begin. avail mem=46.92 GB`, ""},
	}
	for _, c := range cases {
		if got := marks(StartPhases(strings.Split(c.log, "\n"), time.UTC, now)); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// ScanMetrics reads the same phases as StartPhases in its one pass over a log: status
// reads a start in progress from that pass, not from a second read of the log.
func TestScanMetricsFoldsStartPhases(t *testing.T) {
	t.Parallel()
	logs := readReal(t, "startup-*.log")
	logs = append(logs, realLog{name: "whole sglang start", lines: strings.Split(`[2026-12-03 10:00:00 TP0] Load weight begin. avail mem=46.92 GB
[2026-12-03 10:03:11 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=21.01 GB, mem usage=25.91 GB.
[2026-12-03 10:03:20 TP0] KV Cache is allocated. #tokens: 413696, K size: 3.16 GB, V size: 3.16 GB
[2026-12-03 10:05:02 TP0] Capture cuda graph end. Time elapsed: 101.02 s. mem usage=0.31 GB. avail mem=5.67 GB.
[2026-12-03 10:05:40] The server is fired up and ready to roll!`, "\n")}, realLog{name: "vllm's untimed ready line", lines: strings.Split(`(EngineCore_DP0 pid=441) INFO 12-03 11:43:54 [gpu_model_runner.py:3341] Model loading took 2.0513 GiB memory and 27.200487 seconds
(APIServer pid=440) INFO 12-03 11:44:25 [api_server.py:1971] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=440) INFO:     Application startup complete.`, "\n")})
	for _, l := range logs {
		m, err := ScanMetrics(t.Context(), strings.NewReader(strings.Join(l.lines, "\n")+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		want := marks(StartPhases(l.lines, time.Local, time.Now()))
		if got := marks(m.Phases); got != want || want == "" {
			t.Errorf("%s: ScanMetrics' phases %q, StartPhases' %q (both must show some)", l.name, got, want)
		}
	}
}
