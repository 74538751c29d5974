// Package serverlog reads what a model server says about itself in the dialect
// of its engine: SGLang (whose parsing lives in package sglang), vLLM and
// llama.cpp. It gives the server kind one answer for every engine:
//
//   - Sniff names the dialect of a log from its lines (vLLM's
//     "INFO 05-07 02:13:52 [loader.py:458]" and "(APIServer pid=N)", llama.cpp's
//     "llama_model_load:" and "main: server is listening", else SGLang);
//   - DetectFailure names a known fatal error with a hint in that engine's own
//     flags (vLLM's --gpu-memory-utilization, llama.cpp's -ngl), falling back
//     to SGLang's rules;
//   - ScanMetrics folds a whole log into sglang.Metrics: SGLang's batch lines,
//     vLLM's "Engine 000: Avg prompt throughput …" and "SpecDecoding metrics:"
//     lines, llama.cpp's "eval time = … tokens per second" timings, and each
//     dialect's readiness line (ReadyLine);
//   - ParsePrometheus reads /metrics with sglang:, vllm: or llamacpp: names.
//
// The formats come from real logs pasted in public issue threads
// (testdata/real.log names each source) and the engines' sources. Like package
// sglang it holds no global mutable state and never panics on any input.
package serverlog
