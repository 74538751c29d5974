package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// mark is a test kind: a file holding a value. It counts its applies.
type markConfig struct {
	Path     string `hcl:"path"`
	Value    string `hcl:"value"`
	Fail     *bool  `hcl:"fail,optional"`
	Terminal *bool  `hcl:"terminal,optional"` // fails with an error retrying cannot fix
	Hang     *bool  `hcl:"hang,optional"`     // Apply hangs, deaf to its context, until the test ends
	Timeout  string `hcl:"timeout,optional"`  // the step timeout (Timeouter)
	// Old is a file standing for the old half of a make-before-break change: while it
	// exists the mark is unfinished (agent.Finisher), and Finish removes it. Witness is
	// a file Finish copies next to Old (Old + ".witness") as it finishes: what a
	// dependent had written by then.
	Old        *string `hcl:"old,optional"`
	Witness    *string `hcl:"witness,optional"`
	FinishFail *bool   `hcl:"finish_fail,optional"`
	// Watch makes the mark a Watcher: its watch ends when its file is removed (a
	// death the loop must notice and repair at once).
	Watch *bool `hcl:"watch,optional"`
}

type mark struct {
	cfg     *markConfig
	applies *counter
	checks  *counter
	hang    chan struct{} // closed when the test ends
}

// timedMark is a mark with its own step timeout.
type timedMark struct {
	*mark
	t time.Duration
}

func (m timedMark) Timeout() time.Duration { return m.t }

func bindMark(h *harness) agent.Kind {
	k := markKind(h)
	k.Orphan = func(addr string, st *state.Scoped, _ *plans.AgentSettings) (agent.Resource, error) {
		var rec map[string]string
		if has, err := st.Load(&rec); err != nil || !has {
			return nil, err
		}
		return markOrphan{rec["path"]}, nil
	}
	return k
}

func markKind(h *harness) agent.Kind {
	return agent.NewKind("mark", func(r *plans.Resource, c *markConfig) (agent.Resource, hcl.Diagnostics) {
		m := &mark{cfg: c, applies: h.applies, checks: h.checks, hang: h.hang}
		if c.Timeout != "" {
			t, err := time.ParseDuration(c.Timeout)
			if err != nil {
				return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: err.Error()}}
			}
			return timedMark{m, t}, nil
		}
		return m, nil
	})
}

type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(k string) { c.mu.Lock(); c.n[k]++; c.mu.Unlock() }
func (c *counter) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

func (m *mark) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	m.checks.inc(m.cfg.Path)
	have, err := os.ReadFile(m.cfg.Path)
	d := (&agent.Diff{Action: agent.Update}).Add(agent.Set("value", string(have), m.cfg.Value))
	if err == nil && string(have) == m.cfg.Value {
		d = agent.NoChange()
	}
	d.Unfinished = m.unfinished()
	return d, nil
}

func (m *mark) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) error {
	m.applies.inc(m.cfg.Path)
	if m.cfg.Hang != nil && *m.cfg.Hang {
		<-m.hang
		return errors.New("hung")
	}
	if m.cfg.Fail != nil && *m.cfg.Fail {
		return fmt.Errorf("broken on purpose writing %q", m.cfg.Value) // quotes the value, secret or not
	}
	if m.cfg.Terminal != nil && *m.cfg.Terminal {
		return agent.Terminal(errors.New("the plan asks for the impossible"))
	}
	if err := os.WriteFile(m.cfg.Path, []byte(m.cfg.Value), 0o644); err != nil {
		return err
	}
	return env.State.Save(map[string]string{"path": m.cfg.Path}) // what an orphan deletes
}

// markOrphan deletes the file an orphaned mark's record names.
type markOrphan struct{ path string }

func (o markOrphan) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if _, err := os.Stat(o.path); err != nil {
		return agent.NoChange(), nil
	}
	return &agent.Diff{Action: agent.Delete}, nil
}

func (o markOrphan) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) error {
	if err := os.Remove(o.path); err != nil {
		return err
	}
	return env.State.Delete()
}

func (m *mark) unfinished() string {
	if m.cfg.Old == nil {
		return ""
	}
	if _, err := os.Stat(*m.cfg.Old); err != nil {
		return ""
	}
	return "old half " + *m.cfg.Old
}

func (m *mark) Finish(ctx context.Context, env *agent.Env) error {
	if m.cfg.FinishFail != nil && *m.cfg.FinishFail {
		return errors.New("the old member is offline")
	}
	if m.cfg.Witness != nil {
		w, _ := os.ReadFile(*m.cfg.Witness)
		if err := os.WriteFile(*m.cfg.Old+".witness", w, 0o644); err != nil {
			return err
		}
	}
	return os.Remove(*m.cfg.Old)
}

func (m *mark) Watch(ctx context.Context, env *agent.Env) error {
	if m.cfg.Watch == nil || !*m.cfg.Watch {
		return agent.ErrNothingToWatch
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if _, err := os.Stat(m.cfg.Path); err != nil {
				return nil
			}
		}
	}
}

func (m *mark) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	return &agent.Status{Healthy: true, Summary: "ok", Metrics: map[string]float64{"generation": 7}}, nil
}

type harness struct {
	dir      string
	plan     string
	applies  *counter
	checks   *counter
	hang     chan struct{}
	notes    chan string
	addr     string
	cancel   context.CancelFunc
	done     chan error
	readyURL chan string
	log      *syncBuffer // what the daemon logged
	last     string      // the last STATUS= seen by summary
}

// syncBuffer is a bytes.Buffer safe for the daemon's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, planSrc string, interval time.Duration) *harness {
	t.Helper()
	return startTuned(t, planSrc, interval, nil)
}

// startTuned is start with the configuration tuned before Run (var files, a Load of the
// test's own, timeouts).
func startTuned(t *testing.T, planSrc string, interval time.Duration, tune func(h *harness, c *Config)) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{dir: dir, plan: filepath.Join(dir, "plan.hcl"), applies: &counter{n: map[string]int{}}, checks: &counter{n: map[string]int{}}, hang: make(chan struct{}),
		notes: make(chan string, 100), done: make(chan error, 1), readyURL: make(chan string, 1), log: &syncBuffer{}}
	h.write(t, planSrc)
	kinds := []agent.Kind{bindMark(h)}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	t.Cleanup(func() { close(h.hang); cancel(); <-h.done })
	cfg := Config{
		PlanPath: h.plan,
		Load: func() (*plans.Plan, hcl.Diagnostics) {
			return plans.Load(h.plan, plans.Options{Schemas: agent.Schemas(kinds), Vars: []string{"root=" + dir}})
		},
		Kinds:    kinds,
		StateDir: filepath.Join(dir, "state"),
		Interval: interval,
		Listen:   "127.0.0.1:0",
		// The datagrams as sent; notify_test.go proves they reach $NOTIFY_SOCKET.
		Notify: func(state string) error { h.notes <- state; return nil },
		Log:    slog.New(slog.NewTextHandler(h.log, nil)),
		Ready:  func(addr string) { h.readyURL <- "http://" + addr },
		// Short enough for tests, long enough that a loaded machine does not hit
		// them by accident.
		StopGrace:  time.Second,
		StuckGrace: 500 * time.Millisecond,
	}
	if tune != nil {
		tune(h, &cfg)
	}
	go func() { h.done <- Run(ctx, cfg) }()
	select {
	case h.addr = <-h.readyURL:
	case err := <-h.done:
		t.Fatalf("Run ended at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the endpoint did not come up")
	}
	return h
}

func (h *harness) write(t *testing.T, src string) {
	t.Helper()
	// Write beside and rename, as editors do.
	tmp := h.plan + ".tmp"
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, h.plan); err != nil {
		t.Fatal(err)
	}
}

// waitNote waits for a notification containing want.
func (h *harness) waitNote(t *testing.T, want string) string {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case n := <-h.notes:
			if strings.Contains(n, want) {
				return n
			}
		case <-deadline:
			t.Fatalf("no notification with %q", want)
		}
	}
}

func (h *harness) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(h.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor waits until cond holds: what must happen, not how fast (a test that claims a
// speed measures it), so its minute is for a loaded 2-core CI machine, where 20 s ran out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const planV1 = `
variable "root" {}
mark "a" {
  path  = "${var.root}/a"
  value = "v1"
}
`

// metric returns the value of one exact series on /metrics (-1 when absent).
func (h *harness) metric(t *testing.T, series string) float64 {
	t.Helper()
	_, m := h.get(t, "/metrics")
	for _, line := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

func TestLoopAppliesReloadsAndKeepsLastGoodPlan(t *testing.T) {
	t.Parallel()
	h := start(t, planV1, time.Hour)
	// READY=1 comes before the first reconcile (which may take hours); STATUS= says how
	// the resources stand.
	if first := h.waitNote(t, "READY=1"); !strings.Contains(first, "STATUS=starting") {
		t.Errorf("first READY notification = %q", first)
	}
	h.waitNote(t, "STATUS=1 resources: 1 converged, 0 failing")
	a := filepath.Join(h.dir, "a")
	if b, _ := os.ReadFile(a); string(b) != "v1" {
		t.Fatalf("a = %q after the first reconcile", b)
	}

	// An edited plan is picked up by the file watch and applied once.
	h.write(t, strings.Replace(planV1, "v1", "v2", 1))
	h.waitNote(t, "RELOADING=1")
	h.waitNote(t, "READY=1")
	waitFor(t, "the new plan applied", func() bool { b, _ := os.ReadFile(a); return string(b) == "v2" })
	waitFor(t, "its reconcile recorded", func() bool { return h.metric(t, `agent_repairs_total{kind="mark",resource="mark.a"}`) == 2 })
	if n := h.applies.get(a); n != 2 {
		t.Errorf("applies = %d, want 2 (one per plan version)", n)
	}

	// A broken plan keeps the last good one; the resource is not torn down.
	h.write(t, "mark \"a\" {\n  path = \n")
	h.waitNote(t, "RELOADING=1")
	n := h.waitNote(t, "READY=1")
	if !strings.Contains(n, "new plan invalid, running the last good one") {
		t.Errorf("status after a broken plan = %q", n)
	}
	if b, _ := os.ReadFile(a); string(b) != "v2" {
		t.Errorf("a = %q, want v2 kept", b)
	}
	_, metrics := h.get(t, "/metrics")
	// One vocabulary (issue 29, point 5): every per-resource series, the loop's and the
	// status's, carries the address in resource and the kind in kind (name: deprecated).
	for _, series := range []string{"agent_plan_valid 0", `agent_reconciles_total{kind="mark",resource="mark.a"} 2`, `agent_reconcile_duration_seconds_count{kind="mark",resource="mark.a"} 2`,
		`agent_resource_drift{kind="mark",resource="mark.a"} 0`, "agent_last_success_timestamp_seconds", `agent_mark_generation{kind="mark",name="a",resource="mark.a"} 7`,
		`agent_resource_healthy{kind="mark",name="mark.a",resource="mark.a"} 1`, `agent_repairs_total{kind="mark",resource="mark.a"} 2`, `agent_time_to_repair_seconds_count{kind="mark",resource="mark.a"} 2`,
		`agent_resource_down_seconds{kind="mark",resource="mark.a"} 0`, `agent_resource_failing{kind="mark",resource="mark.a"} 0`, "agent_queue_depth 0"} {
		if !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %q:\n%s", series, metrics)
		}
	}
	code, health := h.get(t, "/healthz")
	if code != 200 || !strings.Contains(health, "running the last good one") {
		t.Errorf("/healthz = %d %q", code, health)
	}
	code, status := h.get(t, "/status")
	if code != 200 || !strings.Contains(status, `"command": "status"`) || !strings.Contains(status, `"state_dir"`) || !strings.Contains(status, `"repairs"`) {
		t.Errorf("/status = %d %q", code, status)
	}
}

func TestLoopBacksOffAFailingResourceOnly(t *testing.T) {
	t.Parallel()
	h := start(t, `
variable "root" {}
mark "bad" {
  path  = "${var.root}/bad"
  value = "x"
  fail  = true
}
mark "good" {
  path  = "${var.root}/good"
  value = "y"
}
`, 50*time.Millisecond)
	good, bad := filepath.Join(h.dir, "good"), filepath.Join(h.dir, "bad")
	// The good resource resyncs every 50 ms, but the failing one waits its backoff (about
	// 5 s after the first failure), so it is tried once, while the good one converged
	// and keeps being observed.
	waitFor(t, "10 reconciles of the good resource", func() bool { return h.checks.get(good) >= 10 })
	if n := h.applies.get(bad); n != 1 {
		t.Errorf("the failing resource was tried %d times within its backoff, want 1", n)
	}
	if b, _ := os.ReadFile(good); string(b) != "y" {
		t.Errorf("the good resource did not converge: %q", b)
	}
	_, m := h.get(t, "/metrics")
	// One try, one failure: the turns that held it back are not failures (found in
	// review: it read 10, and a Contains on "} 1" let that pass).
	for _, want := range []string{`agent_reconcile_failures_total{kind="mark",resource="mark.bad"} 1`, `agent_resource_drift{kind="mark",resource="mark.bad"} 1`,
		`agent_resource_failing{kind="mark",resource="mark.bad"} 1`, `agent_resource_consecutive_failures{kind="mark",resource="mark.bad"} 1`} {
		if !slices.Contains(strings.Split(m, "\n"), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, m)
		}
	}
	_, status := h.get(t, "/status")
	if !strings.Contains(status, `"next try"`) || !strings.Contains(status, "broken on purpose") {
		t.Errorf("/status does not show the backoff and the last error:\n%s", status)
	}
}

func TestInvalidFirstPlanFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.hcl")
	os.WriteFile(path, []byte("mark \"a\" {\n"), 0o644)
	err := Run(context.Background(), Config{
		PlanPath: path,
		Load: func() (*plans.Plan, hcl.Diagnostics) {
			return plans.Load(path, plans.Options{Schemas: map[string]func() any{"mark": func() any { return &markConfig{} }}})
		},
		StateDir: filepath.Join(dir, "state"),
		Listen:   "127.0.0.1:0",
		Notify:   func(string) error { return nil },
	})
	if err == nil || !strings.Contains(err.Error(), "plan.hcl") {
		t.Fatalf("Run = %v, want the plan error", err)
	}
}

// A terminal error is not retried, however many passes run, until the plan changes.
func TestLoopStopsRetryingTerminalErrorsUntilThePlanChanges(t *testing.T) {
	t.Parallel()
	const src = `
variable "root" {}
mark "t" {
  path     = "${var.root}/t"
  value    = "x"
  terminal = true
}
`
	h := start(t, src, 50*time.Millisecond)
	path := filepath.Join(h.dir, "t")
	// Held, it is still observed at every resync (to see the host move), never acted on.
	waitFor(t, "20 observations", func() bool { return h.checks.get(path) >= 20 })
	if n := h.applies.get(path); n != 1 {
		t.Errorf("a terminal error was retried: %d tries, want 1", n)
	}
	// The plan changes: the resource is tried again (once more: still terminal).
	h.write(t, strings.Replace(src, `value    = "x"`, `value    = "y"`, 1))
	waitFor(t, "a try after the plan changed", func() bool { return h.applies.get(path) == 2 })
	time.Sleep(300 * time.Millisecond)
	if n := h.applies.get(path); n != 2 {
		t.Errorf("tries after the plan changed = %d, want 2", n)
	}
}

// The daemon's log is the journal: an error that quotes a sensitive value is logged
// with the value redacted (found in review: the CLI's views redacted, the log did not).
func TestLogRedactsSecrets(t *testing.T) {
	t.Parallel()
	const secret = "hf_SuperSecretValue"
	h := start(t, `
variable "root" {}
variable "tok" {
  sensitive = true
  default   = "`+secret+`"
}
mark "a" {
  path  = "${var.root}/a"
  value = var.tok
  fail  = true
}
`, time.Hour)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(h.log.String(), "broken on purpose") {
		if time.Now().After(deadline) {
			t.Fatalf("no failure logged:\n%s", h.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if out := h.log.String(); strings.Contains(out, secret) || !strings.Contains(out, `broken on purpose writing \"(sensitive)\"`) {
		t.Errorf("the log does not redact the secret:\n%s", out)
	}
}

// The same plan hashes the same, whatever order its files come in (found in review: a
// map's order made every reload of a plan directory look like a change, which cleared
// backoff and terminal holds).
func TestPlanHashIsStable(t *testing.T) {
	t.Parallel()
	var srcs []plans.Source
	for i := range 6 {
		srcs = append(srcs, plans.Source{Name: fmt.Sprintf("/p/%d.hcl", i), Data: fmt.Appendf(nil, "# file %d\n", i)})
	}
	p, diags := plans.LoadSources("/p", srcs, plans.Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	first := planHash(p)
	for range 50 {
		if planHash(p) != first {
			t.Fatal("planHash of the same plan differs between calls")
		}
	}
}

// A plan that loads but that the engine rejects (here --target names a resource the new
// plan no longer has) does not replace the last good plan, which keeps reconciling
// (found in review: the loop then reconciled nothing at all).
func TestReloadKeepsTheLastGoodPlanWhenTheEngineRejectsTheNew(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.hcl")
	a := filepath.Join(dir, "a")
	write := func(name string) {
		if err := os.WriteFile(path+".tmp", []byte("mark \""+name+"\" {\n  path  = \""+a+"\"\n  value = \"v1\"\n}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
	}
	write("a")
	kinds := []agent.Kind{bindMark(&harness{applies: &counter{n: map[string]int{}}, checks: &counter{n: map[string]int{}}})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() { cancel(); <-done })
	ready := make(chan string, 1)
	go func() {
		done <- Run(ctx, Config{PlanPath: path,
			Load: func() (*plans.Plan, hcl.Diagnostics) {
				return plans.Load(path, plans.Options{Schemas: agent.Schemas(kinds)})
			},
			Kinds: kinds, StateDir: filepath.Join(dir, "state"), Interval: 50 * time.Millisecond, Listen: "127.0.0.1:0",
			Notify: func(string) error { return nil }, Engine: agent.Options{Targets: []string{"mark.a"}},
			Ready: func(addr string) { ready <- "http://" + addr }})
	}()
	base := <-ready
	waitFor(t, "the first apply", func() bool { b, _ := os.ReadFile(a); return string(b) == "v1" })

	write("renamed") // loads, but --target mark.a names nothing in it
	waitFor(t, "agent_plan_valid 0", func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return slices.Contains(strings.Split(string(b), "\n"), "agent_plan_valid 0")
	})
	if err := os.Remove(a); err != nil { // drift that the last good plan repairs
		t.Fatal(err)
	}
	waitFor(t, "the last good plan to repair the drift", func() bool { b, _ := os.ReadFile(a); return string(b) == "v1" })
}

// The watchdog and /healthz call the loop stuck only when a step in flight is past its
// own timeout and the grace: a long download under its own long timeout is working,
// however long it runs (found in review: a pass past three default step times stopped
// the watchdog, and systemd would kill the agent mid-install).
func TestStuck(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name  string
		res   map[string]*resState
		want  bool
		where string
	}{
		{"starting", nil, false, ""},
		{"a download 2 h into its 3 h timeout", map[string]*resState{"download.q": {inFlight: true, phase: "create", phaseStart: now.Add(-2 * time.Hour), phaseLimit: 3 * time.Hour}}, false, ""},
		{"a probe within the grace", map[string]*resState{"server.q": {inFlight: true, phase: "observe", phaseStart: now.Add(-150 * time.Second), phaseLimit: 2 * time.Minute}}, false, ""},
		{"a probe past its timeout and the grace, beside a long download", map[string]*resState{
			"download.q": {inFlight: true, phase: "create", phaseStart: now.Add(-2 * time.Hour), phaseLimit: 3 * time.Hour},
			"server.q":   {inFlight: true, phase: "observe", phaseStart: now.Add(-4 * time.Minute), phaseLimit: 2 * time.Minute}}, true, "server.q: observe"},
		{"idle, a step long ago", map[string]*resState{"server.q": {phaseStart: now.Add(-24 * time.Hour), phaseLimit: time.Minute}}, false, ""},
	} {
		d := &Daemon{cfg: Config{Interval: time.Minute}, res: tc.res}
		got, why := d.stuck(now)
		if got != tc.want || !strings.HasPrefix(why, tc.where) {
			t.Errorf("%s: stuck = %v (%q), want %v (%q)", tc.name, got, why, tc.want, tc.where)
		}
	}
}

// A step that hangs (deaf to its context) holds only its dependents: an independent
// resource converges and is repaired meanwhile, a reload is READY at once, and /healthz
// turns unhealthy only once the hung step is past its own timeout and the grace.
func TestHangingStepHoldsOnlyItsDependents(t *testing.T) {
	t.Parallel()
	const src = `
variable "root" {}
mark "slow" {
  path    = "${var.root}/slow"
  value   = "x"
  hang    = true
  timeout = "2s"
}
mark "child" {
  path       = "${var.root}/child"
  value      = "c"
  depends_on = [mark.slow]
}
mark "free" {
  path  = "${var.root}/free"
  value = "f"
}
`
	h := start(t, src, 100*time.Millisecond)
	slow, child, free := filepath.Join(h.dir, "slow"), filepath.Join(h.dir, "child"), filepath.Join(h.dir, "free")
	waitFor(t, "the slow step to start", func() bool { return h.applies.get(slow) == 1 })
	began := time.Now()
	waitFor(t, "the independent resource", func() bool { b, _ := os.ReadFile(free); return string(b) == "f" })
	// Drift of the independent resource is repaired while the step hangs.
	if err := os.Remove(free); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the independent resource repaired", func() bool { b, _ := os.ReadFile(free); return string(b) == "f" })
	if code, body := h.get(t, "/healthz"); time.Since(began) < 2*time.Second && code != 200 {
		t.Errorf("/healthz = %d %q within the hung step's timeout", code, body)
	}
	_, status := h.get(t, "/status")
	if !strings.Contains(status, "waiting for mark.slow to converge") {
		t.Errorf("the dependent's status does not say what it waits for:\n%s", status)
	}

	// A plan change is picked up while the step hangs: READY=1 right after RELOADING=1,
	// and the independent resource takes the new value.
	h.write(t, strings.Replace(src, `value = "f"`, `value = "g"`, 1))
	h.waitNote(t, "RELOADING=1")
	reloading := time.Now()
	h.waitNote(t, "READY=1")
	if d := time.Since(reloading); d > 5*time.Second {
		t.Errorf("READY=1 came %s after RELOADING=1: the reload waited for the hung step", d)
	}
	waitFor(t, "the new plan applied beside the hung step", func() bool { b, _ := os.ReadFile(free); return string(b) == "g" })

	// Past the step's 2 s timeout and the 0.5 s grace: stuck, and /healthz says which.
	waitFor(t, "/healthz to turn unhealthy", func() bool { code, _ := h.get(t, "/healthz"); return code == 503 })
	if d := time.Since(began); d < 2*time.Second {
		t.Errorf("/healthz turned unhealthy %s after the step began, before its 2 s timeout", d)
	}
	if _, body := h.get(t, "/healthz"); !strings.Contains(body, "mark.slow: update has run") {
		t.Errorf("/healthz does not name the stuck step: %q", body)
	}
	if n := h.applies.get(child); n != 0 {
		t.Errorf("the dependent acted %d times while its dependency hung", n)
	}
}

// A terminal hold also ends when the host moves under it (what the resource observes
// changes: the foreign port holder went away, the file was fixed by hand), as the hold
// promises; an unchanged host keeps it.
func TestTerminalHoldEndsWhenTheHostChanges(t *testing.T) {
	t.Parallel()
	h := start(t, `
variable "root" {}
mark "t" {
  path     = "${var.root}/t"
  value    = "x"
  terminal = true
}
`, 50*time.Millisecond)
	path := filepath.Join(h.dir, "t")
	waitFor(t, "10 observations under the hold", func() bool { return h.checks.get(path) >= 10 })
	if n := h.applies.get(path); n != 1 {
		t.Fatalf("tries under an unchanged host = %d, want 1", n)
	}
	if err := os.WriteFile(path, []byte("changed by hand"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a try after the host changed", func() bool { return h.applies.get(path) == 2 })
	seen := h.checks.get(path)
	waitFor(t, "10 more observations", func() bool { return h.checks.get(path) >= seen+10 })
	if n := h.applies.get(path); n != 2 {
		t.Errorf("tries after one change of the host = %d, want 2", n)
	}
}

// The loop holds the state lock for its life; at start it waits for an operator's
// command that holds it, says so, and acts on nothing meanwhile.
func TestLoopWaitsForAnOperatorsLock(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "plan.hcl")
	a := filepath.Join(dir, "a")
	if err := os.WriteFile(path, []byte("mark \"a\" {\n  path  = \""+a+"\"\n  value = \"v1\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store, err := state.Open(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	lock, err := store.Acquire(context.Background(), 0, "agent apply plan.hcl")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{applies: &counter{n: map[string]int{}}, checks: &counter{n: map[string]int{}}}
	kinds := []agent.Kind{bindMark(h)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	t.Cleanup(func() { cancel(); <-done })
	ready := make(chan string, 1)
	go func() {
		done <- Run(ctx, Config{PlanPath: path,
			Load: func() (*plans.Plan, hcl.Diagnostics) {
				return plans.Load(path, plans.Options{Schemas: agent.Schemas(kinds)})
			},
			Kinds: kinds, StateDir: filepath.Join(dir, "state"), Interval: 50 * time.Millisecond, Listen: "127.0.0.1:0",
			Notify: func(string) error { return nil }, Ready: func(addr string) { ready <- "http://" + addr }})
	}()
	base := <-ready
	health := func() (int, string) {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, "/healthz to say what it waits for", func() bool {
		code, body := health()
		return code == 503 && strings.Contains(body, "(agent apply plan.hcl)")
	})
	time.Sleep(300 * time.Millisecond) // six resyncs' worth: nothing may act
	if n := h.checks.get(a); n != 0 {
		t.Fatalf("the loop observed %d times while an operator held the lock", n)
	}
	lock.Release()
	waitFor(t, "the loop to start once the lock is free", func() bool { b, _ := os.ReadFile(a); return string(b) == "v1" })
	if code, body := health(); code != 200 {
		t.Errorf("/healthz = %d %q once running", code, body)
	}
	// And now it holds the lock itself, naming itself.
	if _, err := store.Acquire(context.Background(), 0, "agent apply plan.hcl"); err == nil || !strings.Contains(err.Error(), "(agent run "+path+")") {
		t.Errorf("the lock while the loop runs: %v", err)
	}
}

// A dependent waits while its dependency fails (its status names the root cause), and
// acts once the dependency converges, also when both change in a reload.
func TestDependentWaitsForItsDependency(t *testing.T) {
	t.Parallel()
	const src = `
variable "root" {}
mark "a" {
  path  = "${var.root}/a"
  value = "x"
  fail  = true
}
mark "b" {
  path       = "${var.root}/b"
  value      = "y"
  depends_on = [mark.a]
}
mark "c" {
  path       = "${var.root}/c"
  value      = "z"
  depends_on = [mark.b]
}
`
	h := start(t, src, 50*time.Millisecond)
	a, b, c := filepath.Join(h.dir, "a"), filepath.Join(h.dir, "b"), filepath.Join(h.dir, "c")
	waitFor(t, "the dependency to fail", func() bool { return h.applies.get(a) == 1 })
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last /status:\n%s", last)
		}
	}()
	waitFor(t, "the dependents to report their wait", func() bool {
		_, status := h.get(t, "/status")
		last = status
		return strings.Count(status, "waiting for mark.a, which failed: mark.a: update: broken on purpose") == 2
	})
	if h.applies.get(b)+h.applies.get(c)+h.checks.get(b)+h.checks.get(c) != 0 {
		t.Fatal("a dependent was observed or acted on while its dependency failed")
	}
	h.write(t, strings.Replace(strings.Replace(src, "  fail  = true\n", "", 1), `value      = "y"`, `value      = "y2"`, 1))
	waitFor(t, "the chain to converge", func() bool {
		bb, _ := os.ReadFile(b)
		cc, _ := os.ReadFile(c)
		return string(bb) == "y2" && string(cc) == "z"
	})
	h.waitNote(t, "STATUS=3 resources: 3 converged, 0 failing")
}

// A block gone from the plan is an orphan: the loop reports it (drift, an unhealthy
// status) and deletes it only with agent { prune = true }.
func TestOrphansArePrunedOnlyWhenThePlanSays(t *testing.T) {
	t.Parallel()
	const both = `
variable "root" {}
agent {
  prune = PRUNE
}
mark "a" {
  path  = "${var.root}/a"
  value = "x"
}
mark "b" {
  path  = "${var.root}/b"
  value = "y"
}
`
	h := start(t, strings.Replace(both, "PRUNE", "false", 1), 50*time.Millisecond)
	b := filepath.Join(h.dir, "b")
	waitFor(t, "b in place", func() bool { bb, _ := os.ReadFile(b); return string(bb) == "y" })
	h.waitNote(t, "2 converged")
	onlyA := strings.Replace(strings.Replace(both, "PRUNE", "false", 1), "mark \"b\" {\n  path  = \"${var.root}/b\"\n  value = \"y\"\n}\n", "", 1)
	h.write(t, onlyA)
	waitFor(t, "the orphan reported", func() bool {
		_, status := h.get(t, "/status")
		return strings.Contains(status, "orphan: no longer in the plan") && h.metric(t, `agent_resource_drift{kind="mark",resource="mark.b"}`) == 1
	})
	time.Sleep(300 * time.Millisecond) // resyncs: it must stay
	if _, err := os.Stat(b); err != nil {
		t.Fatalf("prune = false deleted the orphan's file: %v", err)
	}
	h.write(t, strings.Replace(onlyA, "prune = false", "prune = true", 1))
	waitFor(t, "the orphan pruned", func() bool { _, err := os.Stat(b); return errors.Is(err, os.ErrNotExist) })
}

// TestLoopFinishesOnceDependentsConverged: the break work of a make-before-break change
// (agent.Finisher) waits while a dependent fails (the old half keeps serving) and is done
// once every dependent last verified converged, after the dependent's own apply.
func TestLoopFinishesOnceDependentsConverged(t *testing.T) {
	t.Parallel()
	const src = `
variable "root" {}
mark "ctr" {
  path    = "${var.root}/ctr"
  value   = "m3"
  old     = "${var.root}/old"
  witness = "${var.root}/srv"
}
mark "srv" {
  path       = "${var.root}/srv"
  value      = "in m3"
  fail       = true
  depends_on = [mark.ctr]
}
`
	dir := t.TempDir()
	old := filepath.Join(dir, "old")
	if err := os.WriteFile(old, []byte("m2"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := start(t, strings.ReplaceAll(src, "${var.root}", dir), 50*time.Millisecond)
	srv := filepath.Join(dir, "srv")
	waitFor(t, "the dependent to fail twice", func() bool { return h.applies.get(srv) >= 2 })
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the old half was removed while its dependent failed: %v", err)
	}
	h.write(t, strings.ReplaceAll(strings.Replace(src, "  fail       = true\n", "", 1), "${var.root}", dir))
	waitFor(t, "the old half to be removed", func() bool {
		_, err := os.Stat(old)
		return os.IsNotExist(err)
	})
	if w, err := os.ReadFile(old + ".witness"); err != nil || string(w) != "in m3" {
		t.Errorf("finished before the dependent converged: it had written %q (%v)", w, err)
	}
	// The old half is gone a moment before the engine logs its verified finish.
	waitFor(t, "the finish logged", func() bool { return strings.Contains(h.log.String(), "finished and verified") })
}

// TestLoopFailedFinishHoldsNoDependent: break work that fails (the old half unreachable)
// is logged and tried again, and holds nothing back: the resource stays converged and
// its dependents are reconciled as usual.
func TestLoopFailedFinishHoldsNoDependent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old := filepath.Join(dir, "old")
	if err := os.WriteFile(old, []byte("m2"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := strings.ReplaceAll(`
variable "root" {}
mark "ctr" {
  path        = "ROOT/ctr"
  value       = "m3"
  old         = "ROOT/old"
  finish_fail = true
}
mark "srv" {
  path       = "ROOT/srv"
  value      = "v1"
  depends_on = [mark.ctr]
}
`, "ROOT", dir)
	h := start(t, src, 50*time.Millisecond)
	srv := filepath.Join(dir, "srv")
	waitFor(t, "the dependent to converge", func() bool {
		b, _ := os.ReadFile(srv)
		return string(b) == "v1" && strings.Contains(h.log.String(), "break work failed")
	})
	h.write(t, strings.Replace(src, `value      = "v1"`, `value      = "v2"`, 1))
	waitFor(t, "the dependent to converge again", func() bool {
		b, _ := os.ReadFile(srv)
		return string(b) == "v2"
	})
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the failing finish removed the old half: %v", err)
	}
	h.waitNote(t, "STATUS=2 resources: 2 converged, 0 failing")
}
