// Command fake-sglang stands in for `python3 -m sglang.launch_server` and, as
// `fake-sglang serve [MODEL] …` (or when named sglang), for `sglang serve`, where
// there is no GPU and no network: in the agent's tests and its quickstart.
//
// The agent judges a server by its process tree, its port, its HTTP endpoints
// and its log, so the fake is faithful in exactly those: it parses SGLang's
// launch flags the way argparse does, with SGLang's whole flag set (flags_gen.go,
// generated from SGLang's server_args.py by scripts/gen-sglang-flags.py: types,
// aliases, choices, nargs, required) and the program name SGLang gives its
// parser ("sglang serve: error: …"; unknown flag or bad value: usage + error,
// exit 2),
// prints SGLang's real startup, batch and failure lines with the
// "[2026-05-01 12:00:00 TP0] " prefix, serves /health (503 until ready),
// /health_generate (a one-token generation, as SGLang's),
// /v1/models, /v1/chat/completions and, with --enable-metrics, /metrics with
// sglang: names, and exits on SIGTERM within milliseconds.
//
// Build: go build -o fake-sglang ./internal/fakesglang
//
// Misbehaviour on command, through FAKE_SGLANG (comma-separated):
//
//	slow-start=DUR   wait DUR while "loading weights" before ready (/health 503)
//	oom              die with torch's "CUDA out of memory" traceback, exit 1
//	oom=kv           die with "Not enough memory. Please try to increase --mem-fraction-static."
//	cuda-graph-fail  die with "Capture cuda graph failed", exit 1
//	exit-on-start    die within a second with "No CUDA GPUs are available", exit 1
//	crash-after=DUR  once ready for DUR, "Scheduler hit an exception", exit 1
//	ignore-sigterm   ignore SIGTERM (children too); only SIGKILL ends it
//	children=N       start N child processes that outlive a SIGKILLed parent
//	setsid-child     start one child in its own session (out of the process group)
//	hold-port        a child inherits the listening socket and keeps the port bound
//	loop             chat answers loop a sentence unless presence_penalty > 0
//	hybrid           print the hybrid (mamba) decode line form
//	wedge[=DUR]      once ready (for DUR), the engine hangs: /health stays 200, while
//	                 /health_generate (503 after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s, with
//	                 SGLang's "Health check failed" line) and generation hang, batch
//	                 lines stop, counters freeze; SIGUSR1 wedges a running fake too
//	busy[=DUR]       slow but progressing: /health_generate answers after DUR (12 s),
//	                 batch lines and counters keep moving
//	load             read the checkpoint at start as SGLang's loader does: every page of
//	                 each *.safetensors under --model-path (and a draft model's), mmapped,
//	                 tensor by tensor in name order (else *.bin/*.pt front to back), so the
//	                 start follows the page cache; the shards' progress line and the
//	                 "Load weight" lines carry the real time (load.go)
//
// Each start compiles a marker "kernel" into TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR
// and logs whether a previous launch had left one there ("JIT cache reused: …").
//
// With --enable-dp-attention and --dp-size N, each of the N DP ranks logs its own
// "[ts DPi TPj] Decode batch" line and exports its own dp_rank series, as SGLang does.
//
// FAKE_SGLANG_DECODE_INTERVAL (Go duration, default 1s, 0 = never) paces the
// periodic "Decode batch, ..." line; one is also printed after each chat
// request. Children are the same binary re-executed with FAKE_SGLANG_ROLE set;
// they keep the parent's argv, as SGLang's scheduler processes do.
package main
