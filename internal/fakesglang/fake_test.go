package main

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/engines"
)

// The flags of the field report's host.
var qwenFlags = []string{
	"--model-path", "", // filled per test
	"--tp-size", "2", "--mem-fraction-static", "0.85", "--mamba-full-memory-ratio", "0.5",
	"--speculative-algo", "NEXTN", "--speculative-num-steps", "3",
	"--speculative-eagle-topk", "1", "--speculative-num-draft-tokens=4", "--enable-metrics",
	"--served-model-name", "qwen",
}

func flags(t *testing.T) []string {
	f := append([]string(nil), qwenFlags...)
	f[1] = t.TempDir()
	return f
}

// TestReadyServesAndReportsMetrics: the startup lines in order, /health, the
// chat answer, the decode lines and /metrics all read back through the
// parsing package the agent uses.
func TestReadyServesAndReportsMetrics(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "", flags(t)...)
	p.waitLog(ctx, t, engines.SGLangReadyLine)

	if code, _, err := get(ctx, p.url("/health")); err != nil || code != http.StatusOK {
		t.Fatalf("/health = %d, %v; want 200", code, err)
	}
	cr := p.chat(ctx, t, map[string]any{
		"model":    "qwen",
		"messages": []map[string]any{{"role": "user", "content": "What is 2+2? Answer with one number."}},
		"sampling": nil, "temperature": 0.7, "presence_penalty": 1.5, "max_tokens": 512,
	})
	if got := cr.Choices[0].Message.Content; !strings.Contains(got, "4") {
		t.Errorf("answer %q lacks 4", got)
	}
	if cr.Usage.PromptTokens == 0 || cr.Usage.TotalTokens != cr.Usage.PromptTokens+cr.Usage.CompletionTokens {
		t.Errorf("usage = %+v", cr.Usage)
	}
	if code, body, _ := get(ctx, p.url("/v1/models")); code != http.StatusOK || !strings.Contains(body, `"id":"qwen"`) {
		t.Errorf("/v1/models = %d %s", code, body)
	}

	p.waitLog(ctx, t, "Decode batch, ")
	log := p.logText()
	order := []string{"server_args=ServerArgs(", "Load weight begin.", "Load weight end.", "KV Cache is allocated.",
		"Capture cuda graph begin.", "Capture cuda graph end.", "Uvicorn running on http://127.0.0.1:" + strconv.Itoa(p.port), engines.SGLangReadyLine}
	at := 0
	for _, s := range order {
		i := strings.Index(log[at:], s)
		if i < 0 {
			t.Fatalf("startup line %q missing or out of order", s)
		}
		at += i
	}
	m, err := engines.ScanMetrics(ctx, strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Ready || m.AcceptLen == nil || *m.AcceptLen != 3.88 || m.AcceptRate == nil || *m.AcceptRate != 0.97 || m.MambaUsage == nil || m.GenThroughput == nil {
		t.Errorf("metrics from the log: ready %v accept len %v rate %v mamba %v gen %v", m.Ready, m.AcceptLen, m.AcceptRate, m.MambaUsage, m.GenThroughput)
	}
	if _, ok := engines.DetectFailure(strings.Split(log, "\n")); ok {
		t.Error("healthy log reported as a failure")
	}

	code, body, err := get(ctx, p.url("/metrics"))
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics = %d, %v", code, err)
	}
	pm, err := engines.ParsePrometheus(body)
	if err != nil {
		t.Fatal(err)
	}
	if pm.AcceptRate == nil || *pm.AcceptRate != 0.97 || pm.Requests == nil || *pm.Requests != 1 {
		t.Errorf("/metrics: accept rate %v requests %v", pm.AcceptRate, pm.Requests)
	}
}

// With DP attention each DP rank logs its decode lines and exports its series:
// the agent's parsers add the ranks' throughput up, from the log and /metrics.
func TestDPAttentionRanksAddUp(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "", "--model-path", t.TempDir(), "--tp-size", "4", "--dp-size", "2", "--enable-dp-attention", "--enable-metrics")
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	p.waitLog(ctx, t, "DP1 TP2] Decode batch, ")
	m, err := engines.ScanMetrics(ctx, strings.NewReader(p.logText()))
	if err != nil {
		t.Fatal(err)
	}
	if m.GenThroughput == nil || *m.GenThroughput < 2*60.47 || *m.GenThroughput > 2*62.1 {
		t.Errorf("log: gen throughput %v, want two ranks' sum", m.GenThroughput)
	}
	code, body, err := get(ctx, p.url("/metrics"))
	if err != nil || code != http.StatusOK || !strings.Contains(body, `dp_rank="1"`) {
		t.Fatalf("/metrics = %d, %v:\n%s", code, err, body)
	}
	pm, err := engines.ParsePrometheus(body)
	if err != nil {
		t.Fatal(err)
	}
	if pm.GenThroughput == nil || *pm.GenThroughput < 2*60.47 || *pm.GenThroughput > 2*62.1 || pm.AcceptLen != nil {
		t.Errorf("/metrics: gen throughput %v (want the sum), accept len %v (want none: no speculative decoding)", pm.GenThroughput, pm.AcceptLen)
	}
}

func TestMetricsOnlyWithEnableMetrics(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	if code, _, _ := get(ctx, p.url("/metrics")); code != http.StatusNotFound {
		t.Errorf("/metrics without --enable-metrics = %d, want 404", code)
	}
	p.waitLog(ctx, t, "Decode batch, ")
	if strings.Contains(p.logText(), "accept len") {
		t.Error("accept len printed without speculative decoding")
	}
}

// TestSlowStartHealth: /health answers 503 while weights "load", 200 after.
func TestSlowStartHealth(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "slow-start=3s", "--model-path", t.TempDir())
	p.waitLog(ctx, t, "Load weight begin.")
	if code, _, err := get(ctx, p.url("/health")); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("/health while loading = %d, %v; want 503", code, err)
	}
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	if code, _, err := get(ctx, p.url("/health")); err != nil || code != http.StatusOK {
		t.Errorf("/health when ready = %d, %v; want 200", code, err)
	}
}

// TestLoop: without a presence penalty the answer is one sentence repeated;
// with one it is the plain answer.
func TestLoop(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "loop", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	msgs := []map[string]any{{"role": "user", "content": "What is 2+2?"}}

	looped := p.chat(ctx, t, map[string]any{"messages": msgs, "temperature": 0.7, "max_tokens": 200})
	got := looped.Choices[0].Message.Content
	if n := strings.Count(got, loopSentence); n < 5 {
		t.Errorf("without presence_penalty: sentence repeated %d times in %q, want a loop", n, got)
	}
	if looped.Choices[0].FinishReason != "length" {
		t.Errorf("loop finish_reason = %q, want length", looped.Choices[0].FinishReason)
	}

	fine := p.chat(ctx, t, map[string]any{"messages": msgs, "temperature": 0.7, "presence_penalty": 1.5, "max_tokens": 200})
	got = fine.Choices[0].Message.Content
	if strings.Count(got, loopSentence) > 1 || !strings.Contains(got, "4") {
		t.Errorf("with presence_penalty: %q, want a plain answer with 4", got)
	}
}

func TestBadCommandLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--model-path", dir, "--no-such-flag", "1"}, "sglang serve: error: unrecognized arguments: --no-such-flag 1"},
		{"bad int", []string{"--model-path", dir, "--tp-size", "two"}, "sglang serve: error: argument --tensor-parallel-size/--tp-size: invalid int value: 'two'"},
		{"bad choice", []string{"--model-path", dir, "--log-requests-level", "5"}, "error: argument --log-requests-level: invalid choice: 5 (choose from 0, 1, 2, 3)"},
		{"bad str choice", []string{"--model-path", dir, "--speculative-algorithm", "MTP"}, "error: argument --speculative-algorithm: invalid choice: 'MTP' (choose from 'EAGLE', 'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM')"},
		{"bad json", []string{"--model-path", dir, "--extra-metric-labels", "{rope"}, "error: argument --extra-metric-labels: invalid loads value: '{rope'"},
		{"bad human int", []string{"--model-path", dir, "--context-length", "32kb"}, "error: argument --context-length: invalid human_readable_int value: '32kb'"},
		{"empty nargs+", []string{"--model-path", dir, "--cuda-graph-bs", "--enable-metrics"}, "error: argument --cuda-graph-bs: expected at least one argument"},
		{"bad float", []string{"--model-path", dir, "--mem-fraction-static=lots"}, "error: argument --mem-fraction-static: invalid float value: 'lots'"},
		{"missing value", []string{"--model-path", dir, "--port"}, "error: argument --port: expected one argument"},
		{"serve entry, model first", []string{"serve", dir, "--no-such-flag"}, "sglang serve: error: unrecognized arguments: --no-such-flag"},
		{"missing model", []string{"--port", "1"}, "error: the following arguments are required: --model-path/--model"},
		{"ambiguous", []string{"--model-path", dir, "--speculative-num", "3"}, "error: ambiguous option: --speculative-num could match"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxWait(t)
			p := launch(t, "", append(tt.args, "--port", "1")...)
			if code := p.waitExit(ctx, t); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			log := p.logText()
			if !strings.HasPrefix(log, "usage: sglang serve [-h] --model-path MODEL_PATH") || !strings.Contains(log, tt.want) {
				t.Errorf("output:\n%s\nwant usage and %q", log, tt.want)
			}
			f, ok := engines.DetectFailure(strings.Split(log, "\n"))
			if !ok || f.Kind != engines.FailureBadFlag {
				t.Errorf("DetectFailure = %+v, %v; want bad-flag", f, ok)
			}
		})
	}
}

// A real command line that ran on SGLang (the MiroThinker README's, paths made local),
// with --log-requests-level 2 among its flags, is accepted with its values.
func TestRealCommandLine(t *testing.T) {
	t.Parallel()
	argv := strings.Fields("--model-path /m --tp 8 --dp 1 --host 0.0.0.0 --port 61002 --trust-remote-code --log-level debug --log-level-http debug --log-requests --log-requests-level 2 --attention-backend flashinfer --enable-metrics --show-time-cost --chat-template assets/qwen3_nonthinking.jinja")
	a, err := parseArgs(argv)
	if err != nil {
		t.Fatal(err)
	}
	if a.int("tp-size") != 8 || a.int("log-requests-level") != 2 || !a.on("log-requests") || a.str("attention-backend") != "flashinfer" || a.str("host") != "0.0.0.0" {
		t.Errorf("parsed %v", a.vals)
	}
	// nargs="+" and human-readable ints, as in real launches.
	a, err = parseArgs(strings.Fields("--model /m --cuda-graph-bs 1 2 4 8 --context-length 32k --max-total-tokens 1Mi --speculative-algo NEXTN --enable-metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if a.str("cuda-graph-bs") != "1 2 4 8" || a.int("context-length") != 32000 || a.int("max-total-tokens") != 1<<20 || !a.on("enable-metrics") {
		t.Errorf("parsed %v", a.vals)
	}
}

// The table is SGLang's whole flag set, generated from its source.
func TestGeneratedFlagTable(t *testing.T) {
	t.Parallel()
	if len(specs) < 300 || parserProg != "sglang serve" {
		t.Fatalf("%d flags, prog %q: not the generated table", len(specs), parserProg)
	}
	seen := map[string]bool{}
	for _, s := range specs {
		for _, n := range s.names {
			if seen[n] || !strings.HasPrefix(n, "--") {
				t.Errorf("flag %q twice or malformed", n)
			}
			seen[n] = true
		}
	}
	for _, n := range []string{"--log-requests-level", "--mamba-full-memory-ratio", "--speculative-eagle-topk", "--enable-dp-attention", "--tool-call-parser", "--model"} {
		if !seen[n] {
			t.Errorf("%s missing", n)
		}
	}
}

// `sglang serve` takes the model as its first argument and prints its own name.
func TestServeEntry(t *testing.T) {
	t.Parallel()
	e, argv := entryOf([]string{"/usr/local/bin/fake-sglang", "serve", "/models/q", "--model-type", "llm", "--port", "1"})
	if e != entryServe || strings.Join(argv, " ") != "--model-path /models/q --port 1" {
		t.Errorf("entry %v argv %q", e, argv)
	}
	if e, argv := entryOf([]string{"fake-sglang", "--model-path", "/m"}); e != entryModule || len(argv) != 2 {
		t.Errorf("entry %v argv %q", e, argv)
	}
	if e, _ := entryOf([]string{"/opt/bin/sglang", "--model-path", "/m"}); e != entryServe || e.prog() != "sglang serve" {
		t.Errorf("entry %v", e)
	}
}

func TestParseArgsForms(t *testing.T) {
	t.Parallel()
	a, err := parseArgs([]string{"--model", "/m", "--speculative-algo", "NEXTN", "--port=31000", "--enable-metrics", "--tensor-parallel-size", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if a.str("model-path") != "/m" || a.str("speculative-algorithm") != "NEXTN" || a.int("port") != 31000 || !a.on("enable-metrics") || a.int("tp-size") != 2 || a.str("host") != "127.0.0.1" {
		t.Errorf("parsed %v", a.vals)
	}
	if _, err := parseArgs([]string{"--model-path", "/m", "--enable-metrics=true"}); err == nil || !strings.Contains(err.Error(), "ignored explicit argument") {
		t.Errorf("bare flag with a value: err = %v", err)
	}
	if a, err := parseArgs([]string{"--model-path", "/m", "--random-seed", "-1"}); err != nil || a.int("random-seed") != -1 {
		t.Errorf("negative number value: %v %v", a.vals["random-seed"], err)
	}
}

func TestLaunchFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, faults string
		args         []string
		line         string
		kind         engines.FailureKind
	}{
		{"oom", "oom", nil, "torch.OutOfMemoryError: CUDA out of memory.", engines.FailureOOM},
		{"oom kv", "oom=kv", nil, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", engines.FailureOOM},
		{"cuda graph", "cuda-graph-fail", nil, "Exception: Capture cuda graph failed:", engines.FailureCUDAGraph},
		{"exit on start", "exit-on-start", nil, "RuntimeError: No CUDA GPUs are available", engines.FailureNoGPU},
		{"crash after ready", "crash-after=300ms", nil, "Scheduler hit an exception: Traceback (most recent call last):", engines.FailureSchedulerCrash},
		{"missing model dir", "", []string{"--model-path", "/nonexistent/fake-sglang-model"}, "OSError: Can't load the configuration of '/nonexistent/fake-sglang-model'", engines.FailureModelPath},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxWait(t)
			args := tt.args
			if args == nil {
				args = []string{"--model-path", t.TempDir()}
			}
			p := launch(t, tt.faults, args...)
			if code := p.waitExit(ctx, t); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			log := p.logText()
			if !strings.Contains(log, tt.line) {
				t.Errorf("log lacks %q", tt.line)
			}
			f, ok := engines.DetectFailure(strings.Split(log, "\n"))
			if !ok || f.Kind != tt.kind {
				t.Errorf("DetectFailure = %+v, %v; want %s", f, ok, tt.kind)
			}
		})
	}
}

func TestPortInUse(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	p := launch(t, "", "--model-path", t.TempDir(), "--port", port)
	if code := p.waitExit(ctx, t); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if f, ok := engines.DetectFailure(strings.Split(p.logText(), "\n")); !ok || f.Kind != engines.FailurePortInUse {
		t.Errorf("DetectFailure = %+v, %v; want port-in-use", f, ok)
	}
}

// TestSIGTERM: a plain fake exits 0 on SIGTERM and takes its children along.
func TestSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "children=1", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	kids := waitChildren(ctx, t, p.cmd.Process.Pid, 1)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(ctx, t); code != 0 {
		t.Errorf("exit after SIGTERM = %d, want 0", code)
	}
	waitGone(ctx, t, kids...)
}

// TestIgnoreSIGTERM: SIGTERM leaves it serving; SIGKILL ends it.
func TestIgnoreSIGTERM(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "ignore-sigterm", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if p.exited() {
		t.Fatal("exited on SIGTERM")
	}
	if code, _, err := get(ctx, p.url("/health")); err != nil || code != http.StatusOK {
		t.Errorf("/health after SIGTERM = %d, %v; want 200", code, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.waitExit(ctx, t); code != -1 {
		t.Errorf("exit code after SIGKILL = %d, want -1 (signalled)", code)
	}
}

// TestChildrenOutliveParent: children=2 survive a SIGKILL of the parent PID
// alone, and die with a kill of the process group.
func TestChildrenOutliveParent(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "children=2", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	pid := p.cmd.Process.Pid
	kids := waitChildren(ctx, t, pid, 2)
	if len(kids) != 2 {
		t.Fatalf("children %v, want 2", kids)
	}
	for _, k := range kids {
		if st, _ := procStat(k); st.pgrp != pid {
			t.Errorf("child %d in group %d, want the parent's %d", k, st.pgrp, pid)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.waitExit(ctx, t)
	for _, k := range kids {
		if !alive(k) {
			t.Errorf("child %d died with its parent", k)
		}
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill group: %v", err)
	}
	waitGone(ctx, t, kids...)
}

// TestSetsidChildLeavesGroup: the setsid child is outside the process group,
// so a group kill misses it.
func TestSetsidChildLeavesGroup(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "setsid-child", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	pid := p.cmd.Process.Pid
	kids := waitChildren(ctx, t, pid, 1)
	k := kids[0]
	t.Cleanup(func() { _ = syscall.Kill(k, syscall.SIGKILL) })
	if st, _ := procStat(k); st.pgrp == pid || st.session != k {
		t.Errorf("setsid child %d: group %d session %d; want its own session", k, st.pgrp, st.session)
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.waitExit(ctx, t)
	if !alive(k) {
		t.Error("setsid child died with the group")
	}
	_ = syscall.Kill(k, syscall.SIGKILL)
	waitGone(ctx, t, k)
}

// TestHoldPort: after the parent is SIGKILLed a child keeps the port bound.
func TestHoldPort(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "hold-port", "--model-path", t.TempDir())
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	pid := p.cmd.Process.Pid
	kids := waitChildren(ctx, t, pid, 1)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.waitExit(ctx, t)
	if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p.port)); err == nil {
		ln.Close()
		t.Fatal("port free after the parent died; want it held by the child")
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	waitGone(ctx, t, kids...)
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p.port))
		if err == nil {
			ln.Close()
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("port still held after the group kill: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
