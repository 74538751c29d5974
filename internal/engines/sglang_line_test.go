package engines

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func ip(n int) *int         { return &n }
func fp(f float64) *float64 { return &f }
func bp(b bool) *bool       { return &b }
func at(s string) time.Time { t, _ := time.ParseInLocation(TimeLayout, s, time.UTC); return t }

// Real lines: from the field report (hybrid GDN model with MTP), from SGLang
// logs in the wild (old "Decode batch." form, trailing commas), and built
// from the f-strings in scheduler_metrics_mixin.py (SWA, iter, prefill
// disaggregation).
func TestParseLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want Event
		ok   bool
	}{
		{
			name: "hybrid mamba decode with MTP (field report)",
			line: "[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, #full token: 272, full token usage: 0.00, mamba num: 1, mamba usage: 0.06, accept len: 3.88, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0",
			want: Event{Time: at("2026-05-09 09:22:05"), Rank: "TP0", Kind: KindDecode,
				RunningReqs: ip(1), FullTokens: ip(272), FullTokenUsage: fp(0), MambaNum: ip(1), MambaUsage: fp(0.06),
				AcceptLen: fp(3.88), AcceptRate: fp(0.97), CUDAGraph: bp(true), GenThroughput: fp(60.47), QueueReqs: ip(0)},
			ok: true,
		},
		{
			name: "newer decode, trailing comma and space",
			line: "[2026-05-01 12:00:00 TP0] Decode batch, #running-req: 3, #token: 4096, token usage: 0.12, accept len: 2.50, accept rate: 0.62, cuda graph: True, gen throughput (token/s): 180.33, #queue-req: 2, ",
			want: Event{Time: at("2026-05-01 12:00:00"), Rank: "TP0", Kind: KindDecode,
				RunningReqs: ip(3), Tokens: ip(4096), TokenUsage: fp(0.12), AcceptLen: fp(2.5), AcceptRate: fp(0.62),
				CUDAGraph: bp(true), GenThroughput: fp(180.33), QueueReqs: ip(2)},
			ok: true,
		},
		{
			name: "older decode form",
			line: "[2025-09-12 07:27:14 TP0] Decode batch. #running-req: 1, #token: 84, token usage: 0.00, cuda graph: True, gen throughput (token/s): 98.94, #queue-req: 0,",
			want: Event{Time: at("2025-09-12 07:27:14"), Rank: "TP0", Kind: KindDecode,
				RunningReqs: ip(1), Tokens: ip(84), TokenUsage: fp(0), CUDAGraph: bp(true), GenThroughput: fp(98.94), QueueReqs: ip(0)},
			ok: true,
		},
		{
			name: "oldest decode form without prefix rank or cuda graph",
			line: "[2025-06-08 21:06:36] Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, gen throughput (token/s): 4594.01, #queue-req: 317",
			want: Event{Time: at("2025-06-08 21:06:36"), Kind: KindDecode,
				RunningReqs: ip(233), Tokens: ip(370959), TokenUsage: fp(0.82), GenThroughput: fp(4594.01), QueueReqs: ip(317)},
			ok: true,
		},
		{
			name: "decode with timestamp suffix",
			line: "[2025-07-18 15:32:54 TP0] Decode batch. #running-req: 1, #token: 2266, token usage: 0.00, cuda graph: True, gen throughput (token/s): 3.13, #queue-req: 0, timestamp: 2025-07-18T15:32:54.159394",
			want: Event{Time: at("2025-07-18 15:32:54"), Rank: "TP0", Kind: KindDecode,
				RunningReqs: ip(1), Tokens: ip(2266), TokenUsage: fp(0), CUDAGraph: bp(true), GenThroughput: fp(3.13), QueueReqs: ip(0)},
			ok: true,
		},
		{
			name: "SWA hybrid decode with iteration and cpu graph",
			line: "[2026-05-01 12:00:01 DP0 TP1] Decode batch [1234], #running-req: 2, #full token: 100, full token usage: 0.01, #swa token: 80, swa token usage: 0.02, cpu graph: False, gen throughput (token/s): 12.00, #queue-req: 0, ",
			want: Event{Time: at("2026-05-01 12:00:01"), Rank: "DP0 TP1", Kind: KindDecode, Iter: ip(1234),
				RunningReqs: ip(2), FullTokens: ip(100), FullTokenUsage: fp(0.01), SWATokens: ip(80), SWATokenUsage: fp(0.02),
				CUDAGraph: bp(false), GenThroughput: fp(12), QueueReqs: ip(0)},
			ok: true,
		},
		{
			name: "older prefill",
			line: "[2025-09-11 10:26:02 TP0] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,",
			want: Event{Time: at("2025-09-11 10:26:02"), Rank: "TP0", Kind: KindPrefill,
				NewSeqs: ip(1), NewTokens: ip(6), CachedTokens: ip(0), TokenUsage: fp(0), RunningReqs: ip(0), QueueReqs: ip(0)},
			ok: true,
		},
		{
			name: "newer hybrid prefill with input throughput (disaggregated prefill)",
			line: "[2026-05-09 09:22:01 TP0] Prefill batch, #new-seq: 1, #new-token: 25, #cached-token: 0, full token usage: 0.00, mamba usage: 0.06, #running-req: 0, #queue-req: 0, #prealloc-req: 0, #inflight-req: 0, input throughput (token/s): 10.55, ",
			want: Event{Time: at("2026-05-09 09:22:01"), Rank: "TP0", Kind: KindPrefill,
				NewSeqs: ip(1), NewTokens: ip(25), CachedTokens: ip(0), FullTokenUsage: fp(0), MambaUsage: fp(0.06),
				RunningReqs: ip(0), QueueReqs: ip(0), InputThroughput: fp(10.55)},
			ok: true,
		},
		{
			name: "no prefix at all",
			line: "Decode batch. #running-req: 256, #token: 12543, token usage: 0.82, gen throughput (token/s): 8234, #queue-req: 0",
			want: Event{Kind: KindDecode, RunningReqs: ip(256), Tokens: ip(12543), TokenUsage: fp(0.82), GenThroughput: fp(8234), QueueReqs: ip(0)},
			ok:   true,
		},
		{
			name: "malformed numbers are absent, not zero",
			line: "[2026-05-01 12:00:00 TP0] Decode batch, #running-req: x, accept len: nan?, gen throughput (token/s): 1.5",
			want: Event{Time: at("2026-05-01 12:00:00"), Rank: "TP0", Kind: KindDecode, GenThroughput: fp(1.5)},
			ok:   true,
		},
		{name: "ready line", line: "[2025-09-11 10:26:05] " + SGLangReadyLine},
		{name: "load weight", line: "[2026-05-01 12:00:00 TP0] Load weight end. type=Qwen3NextForCausalLM, dtype=torch.bfloat16, avail mem=21.01 GB, mem usage=25.91 GB."},
		{name: "decode word only", line: "[2026-05-01 12:00:00 TP0] Decode batch"},
		{name: "decode without fields", line: "Decode batch, nothing: here"},
		{name: "other engine", line: "INFO:     Decode batchy #running-req: 1"},
		{name: "empty", line: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := ParseLineIn(tt.line, time.UTC)
			if ok != tt.ok {
				t.Fatalf("ParseLineIn(%q) ok = %v, want %v", tt.line, ok, tt.ok)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseLineIn(%q) mismatch (-want +got):\n%s", tt.line, diff)
			}
		})
	}
}

func TestSplitPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct {
		line string
		want Prefix
		msg  string
		ok   bool
	}{
		{"[2026-05-01 12:00:00 TP0] Load weight begin. avail mem=46.92 GB", Prefix{Time: at("2026-05-01 12:00:00"), Rank: "TP0"}, "Load weight begin. avail mem=46.92 GB", true},
		{"[2026-05-01 12:00:00] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)", Prefix{Time: at("2026-05-01 12:00:00")}, "INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)", true},
		{"[2026-05-01 12:00:00 DP1 TP3 EP3] x", Prefix{Time: at("2026-05-01 12:00:00"), Rank: "DP1 TP3 EP3"}, "x", true},
		{"[2026-05-01 12:00:00.250 TP0] x", Prefix{Time: at("2026-05-01 12:00:00").Add(250 * time.Millisecond), Rank: "TP0"}, "x", true},
		{"[2026-05-01 12:00:00.25x TP0] x", Prefix{}, "[2026-05-01 12:00:00.25x TP0] x", false},
		{"[25:40:55 TP0] bad hour", Prefix{}, "[25:40:55 TP0] bad hour", false},
		{"Loading safetensors checkpoint shards: 100% Completed | 11/11", Prefix{}, "Loading safetensors checkpoint shards: 100% Completed | 11/11", false},
		{"[2026-13-01 12:00:00] bad month", Prefix{}, "[2026-13-01 12:00:00] bad month", false},
		{"[2026-05-01 12:00:00TP0] glued", Prefix{}, "[2026-05-01 12:00:00TP0] glued", false},
		{"[Gloo] Rank 0 is connected to 0 peer ranks.", Prefix{}, "[Gloo] Rank 0 is connected to 0 peer ranks.", false},
	}
	for _, tt := range tests {
		p, msg, ok := SplitPrefix(tt.line, time.UTC)
		if ok != tt.ok || msg != tt.msg || !p.Time.Equal(tt.want.Time) || p.Rank != tt.want.Rank {
			t.Errorf("SplitPrefix(%q) = %v, %q, %v; want %v, %q, %v", tt.line, p, msg, ok, tt.want, tt.msg, tt.ok)
		}
	}
}

func TestParseLineLocalTime(t *testing.T) {
	t.Parallel()
	loc := time.FixedZone("CEST", 2*3600)
	ev, ok := ParseLineIn("[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1", loc)
	if !ok {
		t.Fatal("not parsed")
	}
	if want := time.Date(2026, 5, 9, 7, 22, 5, 0, time.UTC); !ev.Time.Equal(want) {
		t.Errorf("time = %v, want %v", ev.Time, want)
	}
}

func FuzzParseLine(f *testing.F) {
	f.Add("[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, #full token: 272, full token usage: 0.00, mamba num: 1, mamba usage: 0.06, accept len: 3.88, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0")
	f.Add("[2025-09-11 10:26:02 TP0] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,")
	f.Add("[04:40:55 TP0] Decode batch. #running-req: 2, #token: 4078, token usage: 0.00, gen throughput (token/s): 447.31, #queue-req: 0")
	f.Add("[2026-08-01 10:00:01.250 DP1 PP0 TP1 EP1] Decode batch, #running-req: 4, musa graph: True")
	f.Add("Decode batch [")
	f.Add("[")
	f.Fuzz(func(t *testing.T, line string) {
		ev, ok := ParseLineIn(line, time.UTC)
		if !ok && ev.Kind != 0 {
			t.Errorf("not ok but kind %v", ev.Kind)
		}
		if ok && ev.Kind != KindDecode && ev.Kind != KindPrefill {
			t.Errorf("ok with kind %v", ev.Kind)
		}
		var m Metrics
		m.UpdateIn(line, time.UTC)
		DetectFailure([]string{line})
		parseExposition(line)
		_, _ = ParsePrometheus(line)
	})
}
