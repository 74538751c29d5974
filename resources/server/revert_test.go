package server

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// revertHarness runs the server on srvPlan: apply and plan as a person would, loop as
// `agent run` does (Options.Loop).
type revertHarness struct {
	*srvHarness
	fake string // the command: a copy of the fake a test may remove
}

func newRevertHarness(t *testing.T) *revertHarness {
	t.Helper()
	h := &revertHarness{srvHarness: newSrvHarness(t), fake: fakeSGLang(t)}
	return h
}

func (h *revertHarness) engine(opts agent.Options, vars ...string) *agent.Engine {
	h.t.Helper()
	vars = append([]string{"fake=" + h.fake, "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}, vars...)
	if opts.Memory == nil {
		opts.Memory = h.mem
	}
	return restest.Engine(h.t, h.dir, srvPlan, kindsFor(resources.Machine{}), h.store, opts, vars...)
}

func (h *revertHarness) apply(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(agent.Options{}, vars...).Apply(context.Background(), nil).Steps[0]
}

func (h *revertHarness) loop(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(agent.Options{Loop: true}, vars...).Reconcile(context.Background(), "server.qwen")
}

func (h *revertHarness) plan(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(agent.Options{}, vars...).Plan(context.Background()).Steps[0]
}

func (h *revertHarness) status(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(agent.Options{}, vars...).Status(context.Background()).Steps[0]
}

// launchesOf counts the generations whose log shows the fake's OOM: each is one launch
// of the rejected configuration.
func (h *revertHarness) launchesOf(t *testing.T, line string) int {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(h.logs(), "qwen.*.log"))
	n := 0
	for _, p := range logs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), line) {
			n++
		}
	}
	return n
}

// Issue 25, points 1-3 and 8: an OOM change of a verified server under apply is rolled
// back to the last good command line, verified, within that configuration's own start
// time plus 5 s; apply says both generations; status is degraded with the rejected
// change; the loop does not launch it again; plan marks it; a person's apply tries it
// once more; a plan back to the old configuration is converged.
func TestServerOOMChangeRollsBack(t *testing.T) {
	t.Parallel()
	h := newRevertHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	startTime := first.VerifiedAt.Sub(first.LaunchedAt)

	st := h.apply("faults=oom")
	if st.Err == nil {
		t.Fatal("an OOM change applied without error")
	}
	msg := st.Err.Error()
	for _, want := range []string{"server.qwen: restart: generation 2 failed (out of GPU memory", "CUDA out of memory",
		"rolled back to generation 1's command line, verified, serving"} {
		if !strings.Contains(msg, want) {
			t.Errorf("apply error lacks %q:\n%s", want, msg)
		}
	}
	r := h.record()
	if r.Generation != 3 || r.RevertOf != 1 || r.Reverts != 1 || r.Rejected == nil || r.Rejected.Generation != 2 || r.VerifiedAt.IsZero() || !alive(r.id()) {
		t.Fatalf("record after the revert: %+v", r)
	}
	if r.Env["FAKE_SGLANG"] != "" || alive(first.id()) {
		t.Errorf("generation 3 does not run generation 1's inputs, or generation 1 survived: %+v", r)
	}
	if took := r.VerifiedAt.Sub(r.Rejected.At); took > startTime+5*time.Second {
		t.Errorf("serving again %s after the failure; the old configuration starts in %s (+5 s allowed)", took, startTime)
	}

	s := h.status("faults=oom")
	mustOK(t, s)
	if s.Status.Healthy || !strings.Contains(s.Status.Summary, "the plan's generation 2 was rolled back at") ||
		!strings.Contains(s.Status.Summary, "serving generation 3 (generation 1's command line)") {
		t.Errorf("status summary = %q", s.Status.Summary)
	}
	if s.Status.Metrics["rolled_back"] != 1 || s.Status.Metrics["reverts_total"] != 1 || s.Status.Metrics["generation"] != 3 {
		t.Errorf("status metrics = %v", s.Status.Metrics)
	}
	for _, key := range []string{"rejected_generation", "rejected_at", "rejected_failure", "rolled_back_to"} {
		if !hasField(s.Status, key) {
			t.Errorf("status has no %s: %+v", key, s.Status.Fields)
		}
	}

	p := h.plan("faults=oom")
	if p.Err != nil || p.Diff.Action != agent.Restart || !strings.Contains(p.Diff.Changes[0].Note, "rejected at") ||
		!strings.Contains(p.Diff.Changes[0].Note, "rolled back") {
		t.Errorf("plan of the rejected change: %v %+v", p.Err, p.Diff)
	}

	// agent run: nothing launched; the rolled-back generation serves, converged as far as
	// the loop goes, with the reason as a warning (logged once).
	for range 2 {
		l := h.loop("faults=oom")
		if l.Err != nil || l.Diff == nil || l.Diff.Action != agent.NoOp || !strings.Contains(strings.Join(l.Diff.Warnings, " "), "does not launch that change again until the plan changes it") {
			t.Fatalf("loop on the rejected change: %v %+v", l.Err, l.Diff)
		}
	}
	if n := h.launchesOf(t, "CUDA out of memory"); n != 1 {
		t.Errorf("the rejected configuration was launched %d times, want once", n)
	}
	if r2 := h.record(); r2.id() != r.id() {
		t.Errorf("the loop touched the rolled-back server: %+v", r2)
	}

	// A person's apply tries it once more, and rolls back again.
	st = h.apply("faults=oom")
	if st.Err == nil || !strings.Contains(st.Err.Error(), "generation 4 failed") || !strings.Contains(st.Err.Error(), "rolled back to generation 3's command line") {
		t.Fatalf("apply once more: %v", st.Err)
	}
	if n := h.launchesOf(t, "CUDA out of memory"); n != 2 {
		t.Errorf("the rejected configuration was launched %d times, want twice", n)
	}
	if r := h.record(); r.Reverts != 2 || r.Generation != 5 || !alive(r.id()) {
		t.Errorf("record after the second revert: %+v", r)
	}

	// The plan back to what serves: converged, healthy, no longer rolled back.
	if p := h.plan(); p.Err != nil || p.Diff.Action != agent.NoOp {
		t.Fatalf("plan back to the old configuration: %v %+v", p.Err, p.Diff)
	}
	s = h.status()
	if !s.Status.Healthy || s.Status.Metrics["rolled_back"] != 0 || s.Status.Metrics["reverts_total"] != 2 {
		t.Errorf("status with the plan back: %+v", s.Status)
	}
}

func hasField(st *agent.Status, key string) bool {
	for _, f := range st.Fields {
		if f.Key == key {
			return true
		}
	}
	return false
}

// Issue 25, points 3 and 8, under `agent run`: the loop's own relaunch of the change
// fails and is rolled back, and later passes launch nothing; the rolled-back server
// dying is repaired with the rolled-back command line, never the rejected one.
func TestServerOOMChangeUnderTheLoop(t *testing.T) {
	t.Parallel()
	h := newRevertHarness(t)
	mustOK(t, h.loop())
	first := h.record()
	startTime := first.VerifiedAt.Sub(first.LaunchedAt)
	l := h.loop("faults=oom")
	if l.Err == nil || !strings.Contains(l.Err.Error(), "rolled back to generation 1's command line, verified, serving") {
		t.Fatalf("loop on the OOM change: %v", l.Err)
	}
	r := h.record()
	if took := r.VerifiedAt.Sub(r.Rejected.At); took > startTime+5*time.Second {
		t.Errorf("serving again %s after the failure; the old configuration starts in %s (+5 s allowed)", took, startTime)
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if l := h.loop("faults=oom"); l.Err != nil {
			t.Fatalf("a later pass: %v", l.Err)
		}
	}
	if n := h.launchesOf(t, "CUDA out of memory"); n != 1 {
		t.Errorf("the rejected configuration was launched %d times, want once", n)
	}
	h.kill() // the rolled-back server dies
	l = h.loop("faults=oom")
	mustOK(t, l)
	r2 := h.record()
	if r2.Generation != r.Generation+1 || r2.Env["FAKE_SGLANG"] != "" || !alive(r2.id()) || r2.RevertOf == 0 {
		t.Errorf("repair of the rolled-back server: %+v", r2)
	}
	if n := h.launchesOf(t, "CUDA out of memory"); n != 1 {
		t.Errorf("the repair launched the rejected configuration: %d launches", n)
	}
}

// Issue 25, point 4: revert = false keeps the old behaviour: the failed generation is
// reported, nothing is rolled back.
func TestServerNoRevert(t *testing.T) {
	t.Parallel()
	h := newRevertHarness(t)
	mustOK(t, h.apply("revert=false"))
	first := h.record()
	st := h.apply("revert=false", "faults=oom")
	if st.Err == nil || !strings.Contains(st.Err.Error(), "generation 1 (pid") || !strings.Contains(st.Err.Error(), "was stopped, verified, then: launch of generation 2 failed") ||
		strings.Contains(st.Err.Error(), "rolled back") {
		t.Fatalf("apply with revert = false: %v", st.Err)
	}
	if r := h.record(); r.Generation != 2 || alive(first.id()) || r.RevertOf != 0 || r.Rejected != nil {
		t.Errorf("record with revert = false: %+v", r)
	}
}

// Issue 25, points 1 and 8: a revert whose old command is gone says so and stops there:
// nothing launched, status reports it.
func TestServerRevertOldCommandGone(t *testing.T) {
	t.Parallel()
	h := newRevertHarness(t)
	dir := t.TempDir()
	old := filepath.Join(dir, "venv-old-sglang")
	b, err := os.ReadFile(h.fake)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, b, 0o755); err != nil {
		t.Fatal(err)
	}
	mustOK(t, h.apply("fake="+old))
	if err := os.Remove(old); err != nil {
		t.Fatal(err)
	}
	st := h.apply("faults=oom") // the new command is the fake itself: it runs and OOMs
	if st.Err == nil || !strings.Contains(st.Err.Error(), "generation 2 failed (out of GPU memory") ||
		!strings.Contains(st.Err.Error(), "not rolled back to generation 1's command line") || !strings.Contains(st.Err.Error(), "venv-old-sglang") {
		t.Fatalf("apply: %v", st.Err)
	}
	r := h.record()
	if r.Generation != 2 || r.Rejected == nil || r.Rejected.Refused == "" {
		t.Errorf("record: %+v", r)
	}
	s := h.status("faults=oom")
	if s.Status.Healthy || !hasField(s.Status, "not_rolled_back") {
		t.Errorf("status: %+v", s.Status)
	}
	// Not tried again by the loop either: the change stays rejected.
	if l := h.loop("faults=oom"); l.Err == nil {
		t.Errorf("the loop relaunched a refused revert's change: %+v", h.record())
	}
	if n := h.launchesOf(t, "CUDA out of memory"); n != 1 {
		t.Errorf("the rejected configuration was launched %d times", n)
	}
}

// Issue 25, point 5: an agent killed after the change's launch failed, before the revert
// launched anything, leaves the failed generation's record (dead, its way back kept):
// the next run, apply or loop, finishes the revert and never launches the change again.
func TestServerRevertAfterACrash(t *testing.T) {
	t.Parallel()
	for _, loop := range []bool{false, true} {
		t.Run("loop="+strconv.FormatBool(loop), func(t *testing.T) {
			t.Parallel()
			h := newRevertHarness(t)
			mustOK(t, h.apply())
			first := h.record()
			h.kill()
			// What the killed agent left: generation 2, the change, launched and dead
			// (an OOM) before it was verified, with generation 1's inputs as its way back.
			failed := first
			failed.Generation, failed.Env = 2, map[string]string{"FAKE_SGLANG": "oom", "FAKE_SGLANG_DECODE_INTERVAL": "100ms"}
			failed.VerifiedAt, failed.ReadyAt = time.Time{}, time.Time{}
			failed.LastGood = identityOf(&first)
			if err := h.store.Save("server.qwen", &failed); err != nil {
				t.Fatal(err)
			}
			var st *agent.Step
			if loop {
				st = h.loop("faults=oom")
			} else {
				st = h.apply("faults=oom")
			}
			if st.Err == nil || !strings.Contains(st.Err.Error(), "rolled back to generation 1's command line, verified, serving") {
				t.Fatalf("the run after the crash: %v", st.Err)
			}
			r := h.record()
			if r.Generation != 3 || r.Env["FAKE_SGLANG"] != "" || !alive(r.id()) || r.VerifiedAt.IsZero() {
				t.Errorf("record: %+v", r)
			}
			if n := h.launchesOf(t, "CUDA out of memory"); n != 0 {
				t.Errorf("the rejected change was launched again after the crash (%d)", n)
			}
		})
	}
}

// Issue 25, point 6: a changed smoke test runs against the running server at the next
// apply, without a restart; its result is recorded with its time and shown by status
// (never the old test's result); a failure is degraded, never a relaunch.
func TestServerChangedSmokeTestRuns(t *testing.T) {
	t.Parallel()
	h := newRevertHarness(t)
	mustOK(t, h.apply("faults=loop")) // loops unless presence_penalty > 0; the plan's is 1.5
	first := h.record()
	if first.SmokeDigest == "" || first.SmokeDigest == smokeNone {
		t.Fatalf("the launch did not record its smoke test: %+v", first)
	}

	s := h.status("faults=loop", "penalty=0")
	if got := fieldOf(s.Status, "smoke test"); !strings.HasPrefix(got, "not run yet: the smoke test changed") {
		t.Errorf("status before the changed test ran: smoke test %q", got)
	}
	p := h.plan("faults=loop", "penalty=0")
	if p.Err != nil || p.Diff.Action != agent.Update || p.Diff.Changes[0].Attr != "smoke_test" {
		t.Fatalf("plan of a changed smoke test: %v %+v", p.Err, p.Diff)
	}
	st := h.apply("faults=loop", "penalty=0")
	if st.Err == nil || !strings.Contains(st.Err.Error(), "failed its smoke test") || !strings.Contains(st.Err.Error(), "left running") {
		t.Fatalf("apply of a failing changed smoke test: %v", st.Err)
	}
	r := h.record()
	if r.id() != first.id() || !alive(first.id()) || r.SmokeRanAt.IsZero() || r.SmokeFailure == "" {
		t.Fatalf("after the failed smoke test: %+v", r)
	}
	s = h.status("faults=loop", "penalty=0")
	if s.Status.Healthy || !strings.HasPrefix(fieldOf(s.Status, "smoke test"), "failed at ") || !strings.Contains(s.Status.Summary, "degraded") {
		t.Errorf("status after the failed smoke test: %+v", s.Status)
	}
	if p := h.plan("faults=loop", "penalty=0"); p.Err != nil || p.Diff.Action != agent.NoOp {
		t.Errorf("plan once the changed test ran: %v %+v", p.Err, p.Diff)
	}
	// Changed again, to one that passes: run, recorded, healthy; still the same process.
	mustOK(t, h.apply("faults=loop", "penalty=1.2"))
	if r := h.record(); r.id() != first.id() || r.SmokeFailure != "" || r.SmokeRanAt.IsZero() {
		t.Errorf("after the passing smoke test: %+v", r)
	}
	s = h.status("faults=loop", "penalty=1.2")
	if !s.Status.Healthy || !strings.HasPrefix(fieldOf(s.Status, "smoke test"), "passed at ") {
		t.Errorf("status after the passing smoke test: %+v", s.Status)
	}
}

// groupPlan is two servers of one rollout group on the fake, a declared first.
const groupPlan = `
variable "fake" {}
variable "logs" {}
variable "port_a" { type = number }
variable "port_b" { type = number }
variable "faults" { default = "" }

server "a" {
  command = [var.fake]
  flags   = { "model-path" = "Qwen/Qwen3-8B", "port" = var.port_a }
  env     = { FAKE_SGLANG = var.faults, FAKE_SGLANG_DECODE_INTERVAL = "1h" }
  ready {
    http    = "/health"
    timeout = "15s"
    settle  = "500ms"
  }
  stop { timeout = "2s" }
  log_dir = var.logs
  rollout {
    group           = "qwen"
    max_unavailable = 1
  }
}

server "b" {
  command = [var.fake]
  flags   = { "model-path" = "Qwen/Qwen3-8B", "port" = var.port_b }
  env     = { FAKE_SGLANG = var.faults, FAKE_SGLANG_DECODE_INTERVAL = "1h" }
  ready {
    http    = "/health"
    timeout = "15s"
    settle  = "500ms"
  }
  stop { timeout = "2s" }
  log_dir = var.logs
  rollout {
    group           = "qwen"
    max_unavailable = 1
  }
}
`

// Issue 25, points 4 and 8: in a rollout group, a revert stops the group as any failure
// does (the next member is not disrupted by that apply), and once the rolled-back
// generation is verified (the loop's next pass) the member counts as available again:
// its permit is returned.
func TestServerRevertInARolloutGroup(t *testing.T) {
	t.Parallel()
	h := newSrvState(t)
	logs := filepath.Join(h.dir, "logs")
	vars := []string{"fake=" + fakeSGLang(t), "logs=" + logs, "port_a=" + strconv.Itoa(srvFreePort(t)), "port_b=" + strconv.Itoa(srvFreePort(t))}
	run := func(opts agent.Options, more ...string) *agent.Engine {
		return restest.Engine(t, h.dir, groupPlan, kindsFor(resources.Machine{}), h.store, opts, append(slices.Clone(vars), more...)...)
	}
	for _, st := range run(agent.Options{}).Apply(context.Background(), nil).Steps {
		mustOK(t, st)
	}
	load := func(addr string) serverRecord {
		var r serverRecord
		if ok, err := h.store.Load(addr, &r); !ok || err != nil {
			t.Fatalf("%s: no record: %v", addr, err)
		}
		return r
	}
	b1 := load("server.b")

	rep := run(agent.Options{}, "faults=oom").Apply(context.Background(), nil)
	var errA, errB error
	for _, st := range rep.Steps {
		switch st.Addr {
		case "server.a":
			errA = st.Err
		case "server.b":
			errB = st.Err
		}
	}
	if errA == nil || !strings.Contains(errA.Error(), "rolled back to generation 1's command line, verified, serving") {
		t.Fatalf("server.a: %v", errA)
	}
	if errB == nil || !strings.Contains(errB.Error(), "server.a") {
		t.Errorf("server.b was not held by the stopped rollout: %v", errB)
	}
	if r := load("server.b"); r.id() != b1.id() || !alive(b1.id()) {
		t.Errorf("server.b was disrupted after server.a's revert: %+v", r)
	}
	if m, err := h.store.LoadRollouts(); err != nil || m["server.a"].Failed == "" {
		t.Fatalf("server.a's failure does not stop the group: %v %+v", err, m)
	}

	// The loop's next pass finds the rolled-back generation verified: a is available
	// again, its permit returned.
	loop := run(agent.Options{Loop: true}, "faults=oom")
	if err := loop.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := loop.Reconcile(context.Background(), "server.a"); st.Err != nil {
		t.Fatalf("loop pass of server.a: %v", st.Err)
	}
	if m, err := h.store.LoadRollouts(); err != nil {
		t.Fatal(err)
	} else if _, held := m["server.a"]; held {
		t.Errorf("the rolled-back member still holds its permit: %+v", m)
	}
}
