// Package engines reads what a model server says about itself, in the dialect
// of its serving engine: SGLang, vLLM or llama.cpp. It gives the server kind one
// answer for every engine, in one neutral type (Metrics, Failure):
//
//   - Sniff names the dialect of a log from its lines (vLLM's
//     "INFO 05-07 02:13:52 [loader.py:458]" and "(APIServer pid=N)", llama.cpp's
//     "llama_model_load:" and "main: server is listening", else SGLang), and
//     ReadyLine the line each engine prints once it serves.
//
//   - ScanMetrics folds a whole log into Metrics: SGLang's periodic scheduler
//     lines such as
//
//     [2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, #full token: 272, full token usage: 0.00, mamba num: 1, mamba usage: 0.06, accept len: 3.88, accept rate: 0.97, cuda graph: True, gen throughput (token/s): 60.47, #queue-req: 0,
//
//     (ParseLine parses one into an Event whose missing fields are nil, never
//     zero: a healthy server reporting an accept rate of 0.00 and a server
//     without speculative decoding are different), vLLM's "Engine 000: Avg
//     prompt throughput …" and "SpecDecoding metrics:" lines, llama.cpp's
//     "eval time = … tokens per second" timings, and each dialect's ready line.
//
//   - ParsePrometheus reads /metrics with sglang:, vllm: or llamacpp: names,
//     through prometheus/common's expfmt text parser.
//
//   - DetectFailure names the known ways a launch dies (out of GPU memory,
//     CUDA graph capture, a scheduler exception, a bad flag, a missing model,
//     a busy port, vLLM's engine core) with a hint in that engine's own flags
//     (SGLang's --mem-fraction-static, vLLM's --gpu-memory-utilization,
//     llama.cpp's -ngl), so a failed launch reports the cause from that
//     launch's own log rather than a guess.
//
// The files say whose format they read: sglang_*.go SGLang's (copied from
// SGLang's source, python/sglang/srt/observability/scheduler_metrics_mixin.py
// and metrics_collector.py, formerly managers/ and metrics/), dialect.go and
// failure.go the sniffing and vLLM's and llama.cpp's lines, prometheus.go every
// engine's /metrics names. Each format is checked against real logs pasted in
// public issue threads, kept with their URLs in testdata/real (SGLang) and
// testdata (vLLM, llama.cpp) and tested line by line: SGLang's older
// "Decode batch. " and newer "Decode batch, " forms, 2024's dateless
// "[04:40:55 TP0]" prefix, SGLANG_LOG_MS milliseconds, DP/PP/EP rank prefixes
// (DP ranks' figures add up), cpu/npu/musa graph flags. docs/serving-logs.md
// describes them all. The package holds no global mutable state and never
// panics on any input (FuzzParseLine and FuzzScan guard that).
package engines
