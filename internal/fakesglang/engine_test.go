package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/engines"
)

// decodeLines counts the "Decode batch" lines the fake has logged so far.
func (p *proc) decodeLines() int { return strings.Count(p.logText(), "Decode batch, ") }

// metric returns the text of the first /metrics sample named name ("" if none).
func (p *proc) metric(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	code, body, err := get(ctx, p.url("/metrics"))
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics = %d, %v", code, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, name+"{") {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", name, body)
	return ""
}

// A wedged engine: the front end's /health says 200, while a one-token generation
// (/health_generate) gets no answer within SGLang's HEALTH_CHECK_TIMEOUT and a chat
// request hangs (counted as queued); batch lines stop and the counters freeze.
func TestWedgedEngineFrontEndStillAnswers(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launchEnv(t, []string{"SGLANG_HEALTH_CHECK_TIMEOUT=2"}, "wedge", append(flags(t), "--enable-metrics")...)
	p.waitLog(ctx, t, engines.SGLangReadyLine)

	if code, _, err := get(ctx, p.url("/health")); err != nil || code != http.StatusOK {
		t.Fatalf("/health on a wedged engine = %d, %v; want the front end's 200", code, err)
	}
	tokens := p.metric(ctx, t, "sglang:generation_tokens_total")
	lines := p.decodeLines()

	chatCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	chatDone := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(chatCtx, http.MethodPost, p.url("/v1/chat/completions"),
			strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"2+2?"}]}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		chatDone <- err
	}()
	deadline := time.Now().Add(wait)
	for p.metric(ctx, t, "sglang:num_queue_reqs") != "1" {
		if time.Now().After(deadline) {
			t.Fatal("a hanging chat request never showed as queued in /metrics")
		}
		time.Sleep(50 * time.Millisecond)
	}

	start := time.Now()
	code, _, err := get(ctx, p.url("/health_generate"))
	if took := time.Since(start); err != nil || code != http.StatusServiceUnavailable || took < 2*time.Second {
		t.Fatalf("/health_generate on a wedged engine = %d, %v after %v; want 503 after the 2 s health check timeout", code, err, took)
	}
	if !strings.Contains(p.logText(), "Health check failed. Server couldn't get a response from detokenizer for last 2 seconds.") {
		t.Error("no SGLang health check failure line in the log")
	}
	if err := <-chatDone; err == nil {
		t.Error("a chat request to a wedged engine was answered")
	}
	if got := p.decodeLines(); got != lines {
		t.Errorf("batch lines went on while wedged: %d then %d", lines, got)
	}
	if got := p.metric(ctx, t, "sglang:generation_tokens_total"); got != tokens {
		t.Errorf("generation tokens moved while wedged: %s then %s", tokens, got)
	}
}

// SIGUSR1 wedges a fake that served normally until then.
func TestSIGUSR1Wedges(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launchEnv(t, []string{"SGLANG_HEALTH_CHECK_TIMEOUT=1"}, "", flags(t)...)
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	if code, _, err := get(ctx, p.url("/health_generate")); err != nil || code != http.StatusOK {
		t.Fatalf("/health_generate before the wedge = %d, %v; want 200", code, err)
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for {
		code, _, err := get(ctx, p.url("/health_generate"))
		if err == nil && code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health_generate after SIGUSR1 = %d, %v; want 503", code, err)
		}
	}
	if p.exited() {
		t.Fatal("SIGUSR1 ended the fake")
	}
}

// A busy engine is slow to answer the probe but keeps making progress: the batch
// lines go on while the probe waits, and the probe answers 200 in the end.
func TestBusyEngineProgresses(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	p := launch(t, "busy=1500ms", flags(t)...)
	p.waitLog(ctx, t, engines.SGLangReadyLine)
	lines := p.decodeLines()
	start := time.Now()
	code, _, err := get(ctx, p.url("/health_generate"))
	if took := time.Since(start); err != nil || code != http.StatusOK || took < 1500*time.Millisecond {
		t.Fatalf("/health_generate on a busy engine = %d, %v after %v; want 200 after 1.5 s", code, err, took)
	}
	if got := p.decodeLines(); got < lines+3 {
		t.Errorf("batch lines while the probe waited: %d then %d; want progress", lines, got)
	}
	if code, _, err := get(ctx, p.url("/health")); err != nil || code != http.StatusOK {
		t.Errorf("/health on a busy engine = %d, %v", code, err)
	}
}
