package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
	"github.com/google/go-cmp/cmp"
)

// The fake SGLang server, built once per test binary (into a temporary directory left
// for the OS to clean: this package's TestMain belongs to the container tests).
// fakeSGLang is the fake SGLang server (internal/testbin builds it once).
func fakeSGLang(t *testing.T) string { return testbin.FakeSGLang(t) }

func srvFreePort(t *testing.T) int { return testbin.FreePort(t) }

// srvPlan is a server on the fake; variables change one thing at a time.
const srvPlan = `
variable "fake" {}
variable "logs" {}
variable "port" { type = number }
variable "mem" {
  type    = number
  default = 0.8
}
variable "faults" { default = "" }
variable "penalty" {
  type    = number
  default = 1.5
}
variable "takeover" { default = false }
variable "ready_timeout" { default = "15s" }
variable "settle" { default = "1s" }
variable "stop_timeout" { default = "1s" }
variable "grace" { default = "5m" }
variable "revert" { default = true }

server "qwen" {
  command = [var.fake]
  flags = {
    "model-path"                   = "Qwen/Qwen3-8B"
    "port"                         = var.port
    "mem-fraction-static"          = var.mem
    "speculative-algorithm"        = "NEXTN"
    "speculative-num-draft-tokens" = 4
    "enable-metrics"               = true
    "disable-cuda-graph"           = false
  }
  env  = { FAKE_SGLANG = var.faults, FAKE_SGLANG_DECODE_INTERVAL = "100ms" }
  port = var.port
  ready {
    http     = "/health"
    log_line = "The server is fired up and ready to roll!"
    timeout  = var.ready_timeout
    settle   = var.settle
  }
  stop {
    timeout = var.stop_timeout
  }
  unhealthy_grace = var.grace
  smoke_test {
    prompt         = "What is 2+2? Answer with one number."
    sampling       = { temperature = 0.7, top_p = 0.8, presence_penalty = var.penalty }
    max_tokens     = 64
    expect         = "4"
    max_repetition = 0.3
  }
  takeover = var.takeover
  log_dir  = var.logs
  revert   = var.revert
}
`

// srvHarness runs successive agent runs (a fresh engine each) on one state directory.
// srvState is what both server harnesses keep: the test's directory and state store,
// the recorded launch, and a verified kill of it when the test ends.
type srvState struct {
	t     *testing.T
	dir   string
	store *state.Store
	// mem is what the kinds remember between steps, shared by the harness's engines as
	// by the engines of one `agent run` (agent.Memory).
	mem *agent.Memory
}

func newSrvState(t *testing.T) srvState {
	t.Helper()
	h := srvState{t: t, dir: t.TempDir(), mem: agent.NewMemory()}
	testbin.NoLeaks(t, h.dir) // registered first: it judges what h.kill leaves
	var err error
	if h.store, err = state.Open(filepath.Join(h.dir, "state")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.kill)
	return h
}

func (h srvState) record() serverRecord {
	h.t.Helper()
	var r serverRecord
	if ok, err := h.store.Load("server.qwen", &r); !ok || err != nil {
		h.t.Fatalf("no record: %v", err)
	}
	return r
}

// kill ends whatever the test left running: the recorded launch, verified, and any
// other server launched with its default HOME under the test's directory.
func (h srvState) kill() {
	var r serverRecord
	if ok, _ := h.store.Load("server.qwen", &r); ok && r.PID > 1 {
		// Long enough for a loaded machine: a kill not seen within 1 s left the process
		// running for the test that follows (TestCheckWritesNothing found it alive).
		if _, err := (proc.FS{}).Stop(context.Background(), r.target(), syscall.SIGKILL, 15*time.Second); err != nil {
			h.t.Errorf("kill pid %d: %v", r.PID, err)
		}
	}
	testbin.KillServers(h.dir)
}

type srvHarness struct {
	srvState
	port int
}

func newSrvHarness(t *testing.T) *srvHarness {
	t.Helper()
	return &srvHarness{srvState: newSrvState(t), port: srvFreePort(t)}
}

func (h *srvHarness) logs() string { return filepath.Join(h.dir, "logs") }

func (h *srvHarness) engine(vars ...string) *agent.Engine {
	h.t.Helper()
	vars = append([]string{"fake=" + fakeSGLang(h.t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}, vars...)
	return restest.Engine(h.t, h.dir, srvPlan, kindsFor(resources.Machine{}), h.store, agent.Options{Memory: h.mem}, vars...)
}

func (h *srvHarness) plan(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(vars...).Plan(context.Background()).Steps[0]
}

func (h *srvHarness) apply(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(vars...).Apply(context.Background(), nil).Steps[0]
}

func (h *srvHarness) status(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(vars...).Status(context.Background()).Steps[0]
}

// probe is `agent status --smoke`: status with the smoke test run now.
func (h *srvHarness) probe(vars ...string) *agent.Step {
	h.t.Helper()
	vars = append([]string{"fake=" + fakeSGLang(h.t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}, vars...)
	return restest.Engine(h.t, h.dir, srvPlan, kindsFor(resources.Machine{}), h.store, agent.Options{Probe: true}, vars...).Status(context.Background()).Steps[0]
}

// mustLeaveAlone checks that a healthy server matching the plan (generation 1, first) is
// left alone: plan says no change, and apply keeps the same PID and start time.
func mustLeaveAlone(t *testing.T, plan, apply func(...string) *agent.Step, record func() serverRecord, first serverRecord) {
	t.Helper()
	if st := plan(); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after apply: %v %+v", st.Err, st.Diff)
	}
	mustOK(t, apply())
	if r := record(); r.id() != first.id() || r.Generation != 1 || !alive(first.id()) {
		t.Fatalf("a healthy matching server was touched: %+v", r)
	}
}

func mustOK(t *testing.T, st *agent.Step) {
	t.Helper()
	if st.Err != nil {
		t.Fatalf("%s: %v", st.Addr, st.Err)
	}
}

func alive(id proc.Identity) bool {
	ok, _ := proc.FS{}.Alive(id)
	return ok
}

func fieldOf(st *agent.Status, name string) string {
	for _, f := range st.Fields {
		if f.Name == name {
			return f.Text
		}
	}
	return ""
}

// Points 1, 2, 4, 6, 9: launch, a no-op on a healthy matching server (same PID and
// start time), a changed flag relaunches exactly once with a flag-level reason.
func TestServerLaunchNoOpAndFlagRelaunch(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.Create {
		t.Fatalf("first plan: %v %+v", st.Err, st.Diff)
	}
	mustOK(t, h.apply())
	first := h.record()
	if first.Generation != 1 || first.LogPath != filepath.Join(h.logs(), "qwen.1.log") || first.PGID != first.PID {
		t.Errorf("record = %+v", first)
	}
	if !strings.Contains(strings.Join(first.Argv, " "), "--enable-metrics --mem-fraction-static 0.8 --model-path Qwen/Qwen3-8B --port") ||
		strings.Contains(strings.Join(first.Argv, " "), "disable-cuda-graph") {
		t.Errorf("argv = %q", first.Argv)
	}

	// Healthy and matching: untouched by plan and apply.
	mustLeaveAlone(t, h.plan, h.apply, h.record, first)

	st := h.status()
	mustOK(t, st)
	if !st.Status.Healthy || fieldOf(st.Status, "accept rate") != "0.97" || fieldOf(st.Status, "generation") != "1" ||
		!strings.Contains(fieldOf(st.Status, "smoke test"), "passed") || fieldOf(st.Status, "/metrics requests") == "" {
		t.Errorf("status = %+v", st.Status)
	}
	// The same facts as numbers, for agent run's /metrics (agent_server_<key>{name}).
	for k, want := range map[string]float64{"up": 1, "ready": 1, "generation": 1, "restarts": 0, "accept_rate": 0.97, "smoke_test_passed": 1} {
		if got, ok := st.Status.Metrics[k]; !ok || got != want {
			t.Errorf("Metrics[%s] = %v (present %v), want %v", k, got, ok, want)
		}
	}

	// A changed flag: one restart, with the flag named.
	step := h.plan("mem=0.85")
	if step.Err != nil || step.Diff.Action != agent.Restart || len(step.Diff.Changes) != 1 {
		t.Fatalf("plan: %v %+v", step.Err, step.Diff)
	}
	if c := step.Diff.Changes[0]; c.Attr != `flags["mem-fraction-static"]` || c.Old != json.Number("0.8") || c.New != json.Number("0.85") || c.EffectOf() != agent.Restarts || c.Why() != agent.ReasonIdentity {
		t.Errorf("change = %+v", c)
	}
	mustOK(t, h.apply("mem=0.85"))
	second := h.record()
	if second.Generation != 2 || second.id() == first.id() || alive(first.id()) || !alive(second.id()) {
		t.Fatalf("relaunch: first %v (alive %v), second %+v", first.id(), alive(first.id()), second)
	}
	mustOK(t, h.apply("mem=0.85"))
	if r := h.record(); r.id() != second.id() {
		t.Errorf("relaunched more than once: %+v", r)
	}
	if target, _ := os.Readlink(filepath.Join(h.logs(), "qwen.log")); target != "qwen.2.log" {
		t.Errorf("qwen.log -> %q", target)
	}
}

// Point 5 and the restest.Field report: output that loops under bad sampling is reported as
// degraded with the output, and the healthy server is never killed for it.
func TestServerLoopingOutputDegradedNotKilled(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply("faults=loop"))
	first := h.record()
	// The sampling is not the server's identity: no restart, no kill; the changed smoke
	// test runs against the running server, in place (issue 25, 6), and its failure is
	// reported.
	if st := h.plan("faults=loop", "penalty=0"); st.Err != nil || st.Diff.Action != agent.Update || st.Diff.Changes[0].Attr != "smoke_test" {
		t.Fatalf("plan: %v %+v", st.Err, st.Diff)
	}
	if st := h.apply("faults=loop", "penalty=0"); st.Err == nil || !strings.Contains(st.Err.Error(), "left running") {
		t.Fatalf("apply of a changed smoke test that fails: %v", st.Err)
	}
	st := h.probe("faults=loop", "penalty=0")
	mustOK(t, st)
	if st.Status.Healthy || !strings.Contains(st.Status.Summary, "smoke test failed") ||
		!strings.Contains(fieldOf(st.Status, "smoke output"), "The user is asking for the result of 2+2.") {
		t.Errorf("status = %+v", st.Status)
	}
	if r := h.record(); r.id() != first.id() || !alive(first.id()) {
		t.Fatal("a server whose output loops was killed")
	}
}

// Point 4 and the silent crash: the OOM launch is reported with its own log line, and
// status names the failure of that generation.
func TestServerOOMReportedWithItsLogLine(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	// revert = false: the failed generation stays reported (server_revert_test.go has
	// the rolled-back case).
	st := h.apply("faults=oom", "revert=false")
	if st.Err == nil {
		t.Fatal("an OOM launch applied without error")
	}
	msg := st.Err.Error()
	for _, want := range []string{"launch of generation 2 failed", "exited", "out of GPU memory", "CUDA out of memory", "qwen.2.log", `env["FAKE_SGLANG"]`} {
		if !strings.Contains(msg+fmt.Sprint(st.Diff.Changes), want) {
			t.Errorf("apply error lacks %q:\n%s", want, msg)
		}
	}
	if alive(first.id()) {
		t.Error("generation 1 survived its relaunch")
	}
	s := h.status("faults=oom", "revert=false")
	mustOK(t, s)
	if s.Status.Healthy || !strings.Contains(s.Status.Summary, "out of GPU memory") || fieldOf(s.Status, "generation") != "2" {
		t.Errorf("status = %+v", s.Status)
	}
}

// The stale log: a relaunch that dies before writing a line is never shown with the
// previous generation's lines.
func TestServerStaleLogNeverShownAsCurrent(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	// exit-on-start writes its traceback; a command that writes nothing is starker.
	st := h.apply("fake=/bin/false", "revert=false")
	if st.Err == nil || !strings.Contains(st.Err.Error(), "has no line from this generation") {
		t.Fatalf("apply: %v", st.Err)
	}
	s := h.status("fake=/bin/false", "revert=false")
	mustOK(t, s)
	if got := fieldOf(s.Status, "newest line"); !strings.Contains(got, "generation 2's log has no line") {
		t.Errorf("newest line = %q", got)
	}
	if fieldOf(s.Status, "accept rate") != "" || fieldOf(s.Status, "log") != filepath.Join(h.logs(), "qwen.2.log") {
		t.Errorf("status shows another generation's log: %+v", s.Status)
	}
	if b, _ := os.ReadFile(filepath.Join(h.logs(), "qwen.1.log")); !strings.Contains(string(b), "fired up") {
		t.Error("generation 1's log was not kept")
	}
}

// Point 2: a foreign process on the port is never signalled without takeover; with
// takeover it is stopped (verified) and the server launched. A process running exactly
// the declared command line is adopted, not restarted.
func TestServerForeignPortAndAdoption(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	foreign := exec.Command(fakeSGLang(t), "--model-path", "someone/else", "--port", strconv.Itoa(h.port))
	foreign.Env = []string{"FAKE_SGLANG_DECODE_INTERVAL=0"}
	foreign.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	go foreign.Wait()
	t.Cleanup(func() { _ = syscall.Kill(-foreign.Process.Pid, syscall.SIGKILL) })
	fid := waitPortOwner(t, h.port)
	for _, st := range []*agent.Step{h.plan(), h.apply()} {
		if st.Err == nil || !strings.Contains(st.Err.Error(), fmt.Sprintf("held by pid %d", fid.PID)) || !strings.Contains(st.Err.Error(), "someone/else") {
			t.Errorf("err = %v", st.Err)
		}
	}
	if !alive(fid) {
		t.Fatal("the foreign process was signalled without takeover")
	}
	mustOK(t, h.apply("takeover=true"))
	if alive(fid) {
		t.Error("takeover did not stop the foreign process")
	}
	launched := h.record()
	h.kill()
	_ = h.store.Delete("server.qwen")

	// Adoption: the exact argv, started by someone else.
	own := exec.Command(launched.Argv[0], launched.Argv[1:]...)
	own.Env = []string{"FAKE_SGLANG=", "FAKE_SGLANG_DECODE_INTERVAL=100ms"}
	own.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := own.Start(); err != nil {
		t.Fatal(err)
	}
	go own.Wait()
	t.Cleanup(func() { _ = syscall.Kill(-own.Process.Pid, syscall.SIGKILL) })
	oid := waitPortOwner(t, h.port)
	// The plan proves it and plans its adoption, as an import (writing nothing); apply
	// records it and restarts nothing.
	st := h.plan()
	if st.Err != nil || st.Diff.Action != agent.Adopt || st.Diff.Changes[0].Attr != "process" || !strings.Contains(st.Diff.Changes[0].Note, fmt.Sprintf("adopt pid %d", oid.PID)) {
		t.Fatalf("plan: %v %+v", st.Err, st.Diff)
	}
	if has, _ := h.store.Has("server.qwen"); has {
		t.Errorf("the plan wrote a record: %+v", h.record())
	}
	mustOK(t, h.apply())
	if r := h.record(); r.id() != oid || !r.Adopted || !alive(oid) {
		t.Errorf("record = %+v, want the adopted %v", r, oid)
	}
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.NoOp || len(st.Diff.Warnings) != 0 {
		t.Errorf("plan after adoption: %v %+v", st.Err, st.Diff)
	}
	if r := h.record(); r.id() != oid || !alive(oid) {
		t.Errorf("the adopted server was touched: %+v", r)
	}
}

func waitPortOwner(t *testing.T, port int) proc.Identity {
	t.Helper()
	for range 200 {
		if pids, _ := (proc.FS{}).PortOwners(port); len(pids) > 0 {
			id, err := proc.FS{}.Identify(pids[0])
			if err == nil {
				return id
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on %d", port)
	return proc.Identity{}
}

// Point 3: a dead server is relaunched; leftovers that ignore SIGTERM, children in
// another session and a child holding the port are all stopped, verified, first.
func TestServerDeadLeaderLeftoversStoppedThenRelaunched(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	faults := "faults=ignore-sigterm,children=2,setsid-child,hold-port"
	mustOK(t, h.apply(faults))
	first := h.record()
	_ = syscall.Kill(first.PID, syscall.SIGKILL) // the leader only: children and the port holder live on
	for alive(first.id()) {
		time.Sleep(20 * time.Millisecond)
	}
	st := h.plan(faults)
	if st.Err != nil || st.Diff.Action != agent.Restart || st.Diff.Changes[0].Attr != "process" {
		t.Fatalf("plan: %v %+v", st.Err, st.Diff)
	}
	mustOK(t, h.apply(faults))
	if r := h.record(); r.Generation != 2 || !alive(r.id()) {
		t.Errorf("record = %+v", r)
	}
	// Nothing of generation 1 is left.
	all, _ := proc.FS{}.All()
	for _, s := range all {
		if env, err := (proc.FS{}).Environ(s.PID); err == nil && !s.Dead() {
			for _, e := range env {
				if e == first.Marker {
					t.Errorf("pid %d of generation 1 survived", s.PID)
				}
			}
		}
	}
}

func TestServerBindErrors(t *testing.T) {
	t.Parallel()
	src := `
server "a" {
  container = "not a name!"
  command   = []
  flags     = { port = 1, bad = [1] }
  port      = 2
  stop { signal = "SIGNOPE" }
  ready { timeout = "soon" }
}
`
	_, diags := restest.BindPlan(src, kindsFor(resources.Machine{}))
	var msg string
	for _, d := range diags {
		msg += d.Summary + ": " + d.Detail + "\n"
	}
	for _, want := range []string{"Invalid container", "Empty command", "Invalid flags", "Port differs", "Unknown signal", "Invalid duration"} {
		if !strings.Contains(msg, want) {
			t.Errorf("diagnostics lack %q: %s", want, msg)
		}
	}
}

// Point 1: a live server whose identity matches but that fails readiness is left alone
// within unhealthy_grace (a warning), and relaunched, verified, once it has been unready
// for longer. A frozen process (SIGSTOP) stands in for a hung server.
func TestServerUnhealthyPastGraceIsRelaunched(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	vars := []string{"ready_timeout=3s", "grace=1s"}
	mustOK(t, h.apply(vars...))
	first := h.record()
	if err := syscall.Kill(first.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// An apply within the grace acts on nothing, and records when the server was first
	// found not ready (a plan records nothing). The freeze may not have taken hold of
	// the process by the first probe: applied until a probe finds it not ready.
	var st *agent.Step
	for deadline := time.Now().Add(20 * time.Second); ; {
		st = h.apply(vars...)
		if st.Err != nil || st.Diff.Action != agent.NoOp {
			t.Fatalf("within the grace: %v %+v", st.Err, st.Diff)
		}
		if strings.Contains(strings.Join(st.Diff.Warnings, "\n"), "not ready") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within the grace, never found not ready: %+v", st.Diff)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !alive(first.id()) {
		t.Fatal("a server within its grace was touched")
	}
	// Past the ready timeout after launch and the grace after it was first seen unready.
	deadline := time.Now().Add(20 * time.Second)
	for {
		st = h.plan(vars...)
		if st.Err == nil && st.Diff.Action == agent.Restart {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never relaunched past the grace: %v %+v", st.Err, st.Diff)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if n := st.Diff.Changes[len(st.Diff.Changes)-1].Note; !strings.Contains(n, "unhealthy_grace") {
		t.Errorf("restart note = %q, want it to name unhealthy_grace", n)
	}
	mustOK(t, h.apply(vars...))
	if r := h.record(); r.Generation != 2 || alive(first.id()) || !alive(r.id()) {
		t.Errorf("after the relaunch: record %+v, old alive %v", r, alive(first.id()))
	}
}

// Changes carry typed values: env values as strings, flags read back from their recorded
// display as strings, numbers and booleans; unchanged keys are not changes; only the keys
// that are secrets are sensitive changes.
func TestKeyChanges(t *testing.T) {
	t.Parallel()
	str := func(v string) any { return v }
	secretB := func(k string) bool { return k == "B" }
	got := keyChanges("env", map[string]string{"A": "1", "B": "x", "C": "same"}, map[string]string{"B": "y", "C": "same", "D": "new"}, str, secretB)
	want := []agent.Change{
		{Attr: `env["A"]`, Old: "1", HasOld: true},
		{Attr: `env["B"]`, Old: "x", New: "y", HasOld: true, HasNew: true, Sensitive: true},
		{Attr: `env["D"]`, New: "new", HasNew: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("env changes (-want +got):\n%s", diff)
	}
	got = keyChanges("flags", map[string]string{"mem-fraction-static": "0.8", "algo": `"A"`, "on": "true"},
		map[string]string{"mem-fraction-static": "0.85", "algo": `"B"`}, flagValue, func(string) bool { return false })
	want = []agent.Change{
		{Attr: `flags["algo"]`, Old: "A", New: "B", HasOld: true, HasNew: true},
		{Attr: `flags["mem-fraction-static"]`, Old: json.Number("0.8"), New: json.Number("0.85"), HasOld: true, HasNew: true},
		{Attr: `flags["on"]`, Old: true, HasOld: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("flag changes (-want +got):\n%s", diff)
	}
}

// A process on the port is the previous launch's leftover (stopped with it) only when
// the stop would stop it (proc.Target.Members: TestMembersIsTheOneRule has every case):
// while the group or session it shares is anchored by the live leader, when it carries
// the launch's marker, or when it descends from such a process; after the leader is
// gone, the group's number may name a foreign group that reused the PID, whose process
// must block the launch, not be stopped.
func TestOursNeedsTheLeaderOrTheMarker(t *testing.T) {
	t.Parallel()
	const marker = "AGENT_SERVER=server.qwen#1@1"
	fs := proc.FS{}
	// setsid runs sh as the leader of a new group and session; its child sleeps there.
	spawn := func(t *testing.T, script string, env ...string) (leader *exec.Cmd, child proc.Stat) {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var pid int
		if _, err := fmt.Fscan(out, &pid); err != nil {
			t.Fatal(err)
		}
		// Wait for the child to be sleep itself: while it is between fork and exec, its
		// environ may briefly read as empty.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if argv, _ := fs.Cmdline(pid); len(argv) > 0 && argv[0] == "sleep" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("child %d never became sleep", pid)
			}
		}
		if child, err = fs.Stat(pid); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = fs.Signal(child.Identity(), syscall.SIGKILL)
			cmd.Process.Kill()
			cmd.Wait()
		})
		return cmd, child
	}
	isOurs := func(t *testing.T, st proc.Stat, rec *serverRecord) bool {
		t.Helper()
		ok, err := ours(context.Background(), lifecycle.HostProcs(fs), st, rec)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	const exits = "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"
	const stays = "sleep 300 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 300"

	t.Run("leader gone, no marker: foreign", func(t *testing.T) {
		t.Parallel()
		sh, child := spawn(t, exits)
		sh.Wait() // the leader's PID is free; the child keeps its group and session
		rec := &serverRecord{PID: sh.Process.Pid, StartTicks: child.StartTicks - 100, PGID: sh.Process.Pid, SID: sh.Process.Pid, Marker: marker}
		if isOurs(t, child, rec) {
			t.Error("a process in a group whose leader is gone was taken for the launch's")
		}
	})
	t.Run("leader gone, marker: ours", func(t *testing.T) {
		t.Parallel()
		sh, child := spawn(t, exits, marker)
		sh.Wait()
		rec := &serverRecord{PID: sh.Process.Pid, StartTicks: child.StartTicks - 100, PGID: sh.Process.Pid, SID: sh.Process.Pid, Marker: marker}
		if !isOurs(t, child, rec) {
			t.Error("a leftover carrying the launch's marker was not taken for the launch's")
		}
	})
	t.Run("leader alive: its group is ours", func(t *testing.T) {
		t.Parallel()
		sh, child := spawn(t, stays)
		leader, err := fs.Stat(sh.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		rec := &serverRecord{PID: leader.PID, StartTicks: leader.StartTicks, PGID: leader.PGRP, SID: leader.Session}
		if !isOurs(t, child, rec) {
			t.Error("a child in the live leader's group was not taken for the launch's")
		}
	})
	// The stop's rule (proc.Target.Members) follows descent: a child that left the
	// group and session (setsid) without the marker is the launch's while its parent is.
	t.Run("setsid child of the live leader, no marker: ours", func(t *testing.T) {
		t.Parallel()
		sh, child := spawn(t, "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!; exec sleep 300")
		leader, err := fs.Stat(sh.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if child.PGRP == leader.PGRP || child.Session == leader.Session || child.PPID != leader.PID {
			t.Fatalf("child %+v did not leave leader %+v's group and session as its child", child, leader)
		}
		rec := &serverRecord{PID: leader.PID, StartTicks: leader.StartTicks, PGID: leader.PGRP, SID: leader.Session}
		if !isOurs(t, child, rec) {
			t.Error("the live leader's setsid child, which its stop stops, was taken for a foreign process")
		}
	})
}

// A server ready by ready.log_line stays ready however much log follows the line: the
// launch that saw it records ReadyAt, and a launch the agent did not see get ready
// (adopted) has its whole log read (found in review: only the last 256 KiB were).
func TestLogLineReadinessSurvivesAGrowingLog(t *testing.T) {
	t.Parallel()
	const line = "INFO:     Application startup complete."
	write := func(t *testing.T, parts ...string) string {
		p := filepath.Join(t.TempDir(), "qwen.1.log")
		if err := os.WriteFile(p, []byte(strings.Join(parts, "")), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var traffic strings.Builder
	for i := 0; traffic.Len() < 300<<10; i++ {
		fmt.Fprintf(&traffic, "INFO:     127.0.0.1:5555 - \"POST /v1/chat/completions HTTP/1.1\" 200 OK %d\n", i)
	}
	giant := strings.Repeat("x", 3<<20) + "\n" // one 3 MiB line before the ready line
	for _, tc := range []struct {
		name    string
		log     []string
		readyAt time.Time
		ready   bool
	}{
		{"seen ready at launch, line far back", []string{line + "\n", traffic.String()}, time.Unix(1, 0), true},
		{"adopted, line far back", []string{line + "\n", traffic.String()}, time.Time{}, true},
		{"adopted, line after a giant line", []string{giant, line + "\n", traffic.String()}, time.Time{}, true},
		{"adopted, no line", []string{traffic.String()}, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := &Server{ready: lifecycle.Ready{LogLine: "Application startup complete."}}
			rec := &serverRecord{Generation: 1, LogPath: write(t, tc.log...), Place: "host", ReadyAt: tc.readyAt}
			why := s.notReady(context.Background(), &lifecycle.Lifecycle{Place: lifecycle.Local{}}, rec)
			if (why == "") != tc.ready {
				t.Errorf("notReady = %q, want ready %v", why, tc.ready)
			}
		})
	}
}

// An agent killed after starting a server but before recording it leaves the intent it
// wrote first (Pending). The next agent adopts the process that intent's marker names,
// as that generation, instead of starting a second server beside it (found in review);
// an intent whose process never started is dropped.
func TestServerPendingLaunchIsAdoptedNotDoubled(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	h.kill() // generation 1 is gone, as stopped before a relaunch

	// What the killed agent did: record the intent, then start generation 2.
	marker := "AGENT_SERVER=server.qwen#2@42"
	intent := first
	intent.Generation, intent.Marker, intent.PID, intent.StartTicks = 2, marker, 0, 0
	intent.ReadyAt, intent.VerifiedAt = time.Time{}, time.Time{}
	intent.LogPath = lifecycle.LogFile{Dir: h.logs(), Name: "qwen", Generation: 2}.Path()
	held := first
	held.Pending = &intent
	if err := h.store.Save("server.qwen", &held); err != nil {
		t.Fatal(err)
	}
	lc := &lifecycle.Lifecycle{Place: lifecycle.Local{}}
	x, err := lc.Launch(context.Background(), lifecycle.LaunchOptions{
		Name: "qwen", LogDir: h.logs(), KeepLogs: 5, Generation: 2, Port: h.port,
		Spec:  lifecycle.Spec{Argv: first.Argv, Env: first.Env, Workdir: first.Workdir, Marker: marker},
		Ready: lifecycle.Ready{HTTP: "/health", Timeout: 15 * time.Second},
	})
	t.Cleanup(func() { _, _ = lc.Stop(context.Background(), x.Target(marker), syscall.SIGKILL, time.Second, 0) })
	if err != nil {
		t.Fatal(err)
	}

	// Adopted as that generation, but never verified by an agent: the plan says so
	// (writing nothing), and apply records it and verifies it in place (issue 13, 3).
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.Update || st.Diff.Changes[0].Attr != "verification" {
		t.Fatalf("plan after the crash: %v %+v, want the launch adopted and verified", st.Err, st.Diff)
	}
	if r := h.record(); r.Pending == nil {
		t.Errorf("the plan wrote the record: %+v", r)
	}
	mustOK(t, h.apply())
	r := h.record()
	if r.id() != x.ID || r.Generation != 2 || r.Marker != marker || r.Pending != nil {
		t.Errorf("record %+v, want generation 2 at pid %d with its marker and no intent", r, x.ID.PID)
	}
	if r := h.record(); r.id() != x.ID || !alive(x.ID) || r.VerifiedAt.IsZero() {
		t.Errorf("apply touched the adopted launch, or did not verify it: %+v", r)
	}
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after the verification: %v %+v", st.Err, st.Diff)
	}

	// An intent whose process never started is dropped: the server is launched anew.
	h.kill()
	held = h.record()
	intent.Marker = "AGENT_SERVER=server.qwen#3@43"
	held.Pending = &intent
	if err := h.store.Save("server.qwen", &held); err != nil {
		t.Fatal(err)
	}
	st := h.plan()
	if st.Err != nil || st.Diff.Action == agent.NoOp {
		t.Fatalf("plan with a void intent: %v %+v, want a launch", st.Err, st.Diff)
	}
	if u := st.Diff.Record; u == nil || u.Value.(*serverRecord).Pending != nil {
		t.Errorf("the void intent was kept: %+v", u)
	}
}
