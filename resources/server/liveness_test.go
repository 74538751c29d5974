package server

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// livePlan is srvPlan with a short liveness check: 500 ms apart, 1 s each, 2 in a row.
var livePlan = strings.Replace(srvPlan, "  revert   = var.revert\n", `  revert   = var.revert
  liveness {
    interval = "500ms"
    timeout  = "1s"
    failures = 2
  }
`, 1)

func (h *srvHarness) liveEngine(plan string, vars ...string) *agent.Engine {
	h.t.Helper()
	vars = append([]string{"fake=" + fakeSGLang(h.t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}, vars...)
	return restest.Engine(h.t, h.dir, plan, kindsFor(resources.Machine{}), h.store, agent.Options{Memory: h.mem}, vars...)
}

// watch runs the server's watch, as `agent run` does, until it returns; the channel
// gets its error.
func watch(t *testing.T, e *agent.Engine) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- e.Watch(ctx, "server.qwen") }()
	return done
}

// A wedged engine (its /health still 200, nothing comes out) is proven wedged by the
// watch within interval × failures + timeout, and Check relaunches it with the
// evidence quoted in the plan, the record and the new generation's status.
func TestServerWedgedEngineIsRelaunchedWithTheEvidence(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	e := h.liveEngine(livePlan)
	mustOK(t, e.Apply(context.Background(), nil).Steps[0])
	first := h.record()
	done := watch(t, e)
	time.Sleep(1500 * time.Millisecond) // probes pass: the watch stays
	select {
	case err := <-done:
		t.Fatalf("the watch of a healthy engine returned: %v", err)
	default:
	}
	st := h.liveEngine(livePlan).Status(context.Background()).Steps[0]
	if got := fieldOf(st.Status, "liveness"); !strings.HasPrefix(got, "alive: /health_generate every 500ms (timeout 1s, 2 failures in a row)") || !st.Status.Healthy {
		t.Errorf("status of a healthy engine: liveness %q, healthy %v", got, st.Status.Healthy)
	}

	if err := syscall.Kill(first.PID, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	wedged := time.Now()
	bound := 500*time.Millisecond*2 + time.Second
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		// One interval more: the wedge may start just after a probe was sent.
		if d := time.Since(wedged); d > bound+500*time.Millisecond+2*time.Second {
			t.Errorf("wedge found after %s, want within %s (+ slack)", d, bound)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watch never found the wedge")
	}
	if !alive(first.id()) {
		t.Fatal("the watch itself killed the server: only Check decides, and apply acts")
	}
	plan := h.liveEngine(livePlan).Plan(context.Background()).Steps[0]
	if plan.Err != nil || plan.Diff.Action != agent.Restart || plan.Diff.Changes[0].Reason != agent.ReasonWedged {
		t.Fatalf("plan of a wedged engine: %v %+v", plan.Err, plan.Diff)
	}
	evidence := plan.Diff.Changes[0].Old
	for _, want := range []string{"engine wedged: 2 liveness probes of /health_generate in a row went unanswered", "timed out after 1s", "newest batch line", "unchanged", "queued"} {
		if !strings.Contains(agent.Render(evidence), want) {
			t.Errorf("evidence %q lacks %q", agent.Render(evidence), want)
		}
	}

	mustOK(t, h.liveEngine(livePlan).Apply(context.Background(), nil).Steps[0])
	rec := h.record()
	if rec.Generation != 2 || alive(first.id()) || rec.Wedge == nil || rec.Wedge.Generation != 1 || rec.Wedges != 1 ||
		!strings.Contains(rec.Wedge.Evidence, "went unanswered") {
		t.Fatalf("after the relaunch: generation %d, old alive %v, wedge %+v (%d)", rec.Generation, alive(first.id()), rec.Wedge, rec.Wedges)
	}
	st = h.liveEngine(livePlan).Status(context.Background()).Steps[0]
	if got := fieldOf(st.Status, "replaced"); !strings.Contains(got, "generation 1 (pid "+strconv.Itoa(first.PID)+"), found wedged at") || !strings.Contains(got, "went unanswered") {
		t.Errorf("status of the new generation: replaced %q", got)
	}
	if st.Status.Metrics["wedges_total"] != 1 || !st.Status.Healthy {
		t.Errorf("status of the new generation: wedges_total %v, healthy %v (%s)", st.Status.Metrics["wedges_total"], st.Status.Healthy, st.Status.Summary)
	}
}

// A busy engine (its probe answers only after 3 s, while batch lines and counters move)
// fails its probes and is degraded, never relaunched; an apply with no watch never acts
// on a probe at all.
func TestServerBusyEngineIsDegradedNotRelaunched(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	e := h.liveEngine(livePlan, "faults=busy=3s")
	mustOK(t, e.Apply(context.Background(), nil).Steps[0])
	first := h.record()
	done := watch(t, e)
	deadline := time.Now().Add(6 * time.Second)
	var st *agent.Step
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("the watch of a busy engine returned: %v", err)
		case <-time.After(500 * time.Millisecond):
		}
		st = h.liveEngine(livePlan, "faults=busy=3s").Status(context.Background()).Steps[0]
	}
	if got := fieldOf(st.Status, "liveness"); !strings.Contains(got, "degraded since") || !strings.Contains(got, "making progress") {
		t.Errorf("liveness of a busy engine: %q", got)
	}
	if st.Status.Healthy || !strings.Contains(st.Status.Summary, "slow, not wedged") {
		t.Errorf("status of a busy engine: healthy %v, %q", st.Status.Healthy, st.Status.Summary)
	}
	plan := h.liveEngine(livePlan, "faults=busy=3s").Plan(context.Background()).Steps[0]
	if plan.Err != nil || plan.Diff.Action != agent.NoOp {
		t.Fatalf("plan of a busy engine: %v %+v", plan.Err, plan.Diff)
	}
	if r := h.record(); r.id() != first.id() || !alive(first.id()) {
		t.Fatalf("a busy engine was touched: %+v", r)
	}
}

// Without a liveness block a server whose log names an engine gets that engine's
// default; one whose log names none (a file server, a script) gets no check; the block
// overrides what it sets; enabled = false turns it off.
func TestLivenessPlanDefaults(t *testing.T) {
	cases := []struct {
		name  string
		plan  livenessPlan
		d     engines.Dialect
		known bool
		want  lifecycle.Liveness
		on    bool
	}{
		{"SGLang, no block", livenessPlan{}, engines.SGLang, true, lifecycle.Liveness{Path: "/health_generate", Interval: 15 * time.Second, Timeout: 20 * time.Second, Failures: 3}, true},
		{"vLLM, no block", livenessPlan{}, engines.VLLM, true, lifecycle.Liveness{Path: "/health", Interval: 15 * time.Second, Timeout: 20 * time.Second, Failures: 3}, true},
		{"llama.cpp, no block", livenessPlan{}, engines.LlamaCPP, true, lifecycle.Liveness{Path: "/health", Interval: 15 * time.Second, Timeout: 20 * time.Second, Failures: 3}, true},
		{"no engine, no block", livenessPlan{}, engines.SGLang, false, lifecycle.Liveness{}, false},
		{"no engine, a block", livenessPlan{declared: true, http: "/ping"}, engines.SGLang, false, lifecycle.Liveness{Path: "/ping", Interval: 15 * time.Second, Timeout: 20 * time.Second, Failures: 3}, true},
		{"block overrides", livenessPlan{declared: true, interval: time.Second, timeout: 2 * time.Second, failures: 5}, engines.SGLang, true, lifecycle.Liveness{Path: "/health_generate", Interval: time.Second, Timeout: 2 * time.Second, Failures: 5}, true},
		{"off", livenessPlan{declared: true, off: true}, engines.SGLang, true, lifecycle.Liveness{}, false},
	}
	for _, c := range cases {
		got, on := c.plan.config(c.d, c.known)
		if got != c.want || on != c.on {
			t.Errorf("%s: %+v %v, want %+v %v", c.name, got, on, c.want, c.on)
		}
	}
}

// A server without a liveness block, watched by the loop, is judged by SGLang's default
// check, and status says so.
func TestServerWithoutLivenessBlockGetsTheDefault(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	e := h.engine()
	mustOK(t, e.Apply(context.Background(), nil).Steps[0])
	if got := fieldOf(h.status().Status, "liveness"); got != "" {
		t.Errorf("before any watch, status claims a liveness verdict: %q", got)
	}
	done := watch(t, e)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := fieldOf(h.status().Status, "liveness")
		if got == "alive: /health_generate every 15s (timeout 20s, 3 failures in a row)" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("liveness of a watched server without a block: %q", got)
		}
		select {
		case err := <-done:
			t.Fatalf("the watch returned: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The block's errors point at it, with the fix.
func TestServerLivenessBindErrors(t *testing.T) {
	for _, c := range []struct{ block, want string }{
		{`liveness { failures = 0 }`, "at least 1"},
		{`liveness { http = "health" }`, "is a path on the server's port"},
		{`liveness { interval = "soon" }`, "not a positive duration"},
	} {
		src := "server \"s\" {\n  command = [\"x\"]\n  port = 30000\n  " + c.block + "\n}\n"
		_, diags := restest.BindPlan(src, kindsFor(resources.Machine{}))
		if !strings.Contains(diags.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.block, diags, c.want)
		}
	}
	_, diags := restest.BindPlan("server \"s\" {\n  command = [\"x\"]\n  liveness {}\n}\n", kindsFor(resources.Machine{}))
	if !strings.Contains(diags.Error(), "liveness probes the server's port") {
		t.Errorf("a liveness block without a port: %v", diags)
	}
	if _, diags := restest.BindPlan("server \"s\" {\n  command = [\"x\"]\n  liveness { enabled = false }\n}\n", kindsFor(resources.Machine{})); diags.HasErrors() {
		t.Errorf("enabled = false needs no port: %v", diags)
	}
}
