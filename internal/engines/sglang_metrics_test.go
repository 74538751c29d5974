package engines

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// A log in the order SGLang prints it, with a tqdm bar, a traceback-free
// hybrid MTP run and a newer decode line that lacks the speculative fields.
const sampleLog = `[2026-05-09 09:18:40] server_args=ServerArgs(model_path='/models', tp_size=2, mem_fraction_static=0.85)
[2026-05-09 09:18:50 TP0] Load weight begin. avail mem=46.92 GB
Loading safetensors checkpoint shards: 100% Completed | 11/11 [00:35<00:00,  3.21s/it]
[2026-05-09 09:19:30 TP0] Load weight end. type=Qwen3NextForCausalLM, dtype=torch.bfloat16, avail mem=21.01 GB, mem usage=25.91 GB.
[2026-05-09 09:20:01] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-05-09 09:20:06] The server is fired up and ready to roll!
[2026-05-09 09:22:01 TP0] Prefill batch, #new-seq: 1, #new-token: 25, #cached-token: 0, full token usage: 0.00, mamba usage: 0.06, #running-req: 0, #queue-req: 0, 
[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, #full token: 272, full token usage: 0.00, mamba num: 1, mamba usage: 0.06, accept len: 3.88, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0, 
[2026-05-09 09:22:07 TP0] Decode batch, #running-req: 1, #full token: 432, full token usage: 0.01, mamba num: 1, mamba usage: 0.06, accept len: 4.00, accept rate: 1.00, cuda graph: True, gen throughput (token/s): 62.10, #queue-req: 0, 
[2026-05-09 09:22:08] INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK
`

func TestScanMetrics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := ScanMetrics(ctx, strings.NewReader(sampleLog))
	if err != nil {
		t.Fatal(err)
	}
	want := Metrics{
		RunningReqs:   ip(1),
		QueueReqs:     ip(0),
		Tokens:        ip(432),
		TokenUsage:    fp(0.01),
		MambaUsage:    fp(0.06),
		AcceptLen:     fp(4),
		AcceptRate:    fp(1),
		CUDAGraph:     bp(true),
		GenThroughput: fp(62.10),
		Lines:         10,
		Events:        3,
		Ready:         true,
		ListenURL:     "http://127.0.0.1:30000",
		Phases: []PhaseMark{
			{Phase: PhaseWeights, At: time.Date(2026, 5, 9, 9, 19, 30, 0, time.Local)},
			{Phase: PhaseReady, At: time.Date(2026, 5, 9, 9, 20, 6, 0, time.Local)},
		},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Metrics{}, "LastLineTime", "LastEvent", "ReadyAt"), cmpopts.IgnoreUnexported(Metrics{})); diff != "" {
		t.Errorf("ScanMetrics mismatch (-want +got):\n%s", diff)
	}
	if got.LastEvent.Format(TimeLayout) != "2026-05-09 09:22:07" || got.LastLineTime.Format(TimeLayout) != "2026-05-09 09:22:08" || got.ReadyAt.Format(TimeLayout) != "2026-05-09 09:20:06" {
		t.Errorf("times: last event %v, last line %v, ready %v", got.LastEvent, got.LastLineTime, got.ReadyAt)
	}
}

func TestMetricsKeepsFieldsANewerLineLacks(t *testing.T) {
	t.Parallel()
	var m Metrics
	m.Update("[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, #token: 10, token usage: 0.10, accept len: 3.88, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0, ")
	m.Update("[2026-05-09 09:22:06 TP0] Prefill batch, #new-seq: 2, #new-token: 40, #cached-token: 0, token usage: 0.20, #running-req: 1, #queue-req: 1, ")
	if m.AcceptRate == nil || *m.AcceptRate != 0.97 {
		t.Errorf("accept rate = %v, want 0.97 kept from the decode line", m.AcceptRate)
	}
	if *m.TokenUsage != 0.20 || *m.QueueReqs != 1 {
		t.Errorf("token usage %v queue %v, want the prefill line's 0.20 and 1", *m.TokenUsage, *m.QueueReqs)
	}
	if m.Ready {
		t.Error("ready without the ready line")
	}
}

func TestScanMetricsLongLineAndCancel(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", maxLine+10) + "\n" + "[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 7\n"
	m, err := ScanMetrics(context.Background(), strings.NewReader(long))
	if err != nil {
		t.Fatal(err)
	}
	if m.RunningReqs == nil || *m.RunningReqs != 7 || m.Lines != 1 {
		t.Errorf("after an overlong line: running %v lines %d", m.RunningReqs, m.Lines)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ScanMetrics(ctx, strings.NewReader(sampleLog)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled scan err = %v, want context.Canceled", err)
	}
}

// Names and labels as SGLang's SchedulerMetricsCollector exports them, two
// tensor-parallel ranks.
const sampleExposition = `# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="1"} 9.0
sglang:num_running_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.01
sglang:mamba_usage{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.06
sglang:gen_throughput{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 60.47
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.0
sglang:spec_accept_length{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 3.88
sglang:spec_accept_rate{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} 0.97
sglang:cache_hit_rate{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="0"} NaN
sglang:prompt_tokens_total{model_name="qwen \"q\", v2"} 1234.0
sglang:generation_tokens_total{model_name="qwen"} 5678.0 1715242925000
sglang:num_requests_total{model_name="qwen"} 12.0
go_gc_duration_seconds{quantile="0"} 1.2e-05
broken{ 1
`

func TestParsePrometheus(t *testing.T) {
	t.Parallel()
	got, err := ParsePrometheus(sampleExposition)
	if err != nil {
		t.Fatal(err)
	}
	want := Metrics{
		RunningReqs:      ip(1),
		QueueReqs:        ip(0),
		TokenUsage:       fp(0.01),
		MambaUsage:       fp(0.06),
		GenThroughput:    fp(60.47),
		AcceptLen:        fp(3.88),
		AcceptRate:       fp(0.97),
		PromptTokens:     fp(1234),
		GenerationTokens: fp(5678),
		Requests:         fp(12),
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Metrics{})); diff != "" {
		t.Errorf("ParsePrometheus mismatch (-want +got):\n%s", diff)
	}
	if _, err := ParsePrometheus("go_goroutines 8\n"); !errors.Is(err, ErrNoMetrics) {
		t.Errorf("no sglang metrics: err = %v, want ErrNoMetrics", err)
	}
	s := parseExposition(`sglang:prompt_tokens_total{model_name="qwen \"q\", v2"} 1`)
	if len(s) != 1 || s[0].Labels["model_name"] != `qwen "q", v2` {
		t.Errorf("escaped label: %+v", s)
	}
}
