// Package sglang reads what an SGLang server says about itself: the lines of
// its log and its Prometheus /metrics exposition.
//
// The agent never trusts a remembered event; it judges a server from what the
// server printed during this launch generation. SGLang prints its serving
// state as periodic scheduler lines such as
//
//	[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, #full token: 272, full token usage: 0.00, mamba num: 1, mamba usage: 0.06, accept len: 3.88, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0,
//
// and its failures as Python tracebacks and argparse errors. This package
// turns those into typed values:
//
//   - ParseLine parses one Prefill/Decode batch line into an Event whose
//     missing fields are nil, never zero: a healthy server reporting an accept
//     rate of 0.00 and a server without speculative decoding are different.
//   - Metrics keeps the latest value of every field over a stream of lines
//     (Update, or ScanMetrics over a whole log file), and ParsePrometheus
//     fills the same type from SGLang's sglang:-prefixed gauges.
//   - DetectFailure names the known ways a launch dies (out of GPU memory,
//     CUDA graph capture, a scheduler exception, a bad flag, a missing model,
//     a busy port) with a short hint for the operator, so a failed launch
//     reports the cause from that launch's own log rather than a guess.
//
// The formats were copied from SGLang's source
// (python/sglang/srt/observability/scheduler_metrics_mixin.py and
// metrics_collector.py, formerly managers/ and metrics/) and checked against
// real logs pasted in public issue threads, kept with their URLs in
// testdata/real and tested line by line: the older "Decode batch. " and the
// newer "Decode batch, " forms, 2024's dateless "[04:40:55 TP0]" prefix,
// SGLANG_LOG_MS milliseconds, DP/PP/EP rank prefixes (DP ranks' figures add
// up), cpu/npu/musa graph flags. docs/serving-logs.md describes them all. The
// package holds no global mutable state and never panics on any input
// (FuzzParseLine guards that).
package sglang
