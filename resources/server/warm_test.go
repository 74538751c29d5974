package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/internal/warm"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// warmPlanText is a server on local weights that the fake reads (FAKE_SGLANG=load), with
// a warm block.
const warmPlanText = `
variable "fake" {}
variable "logs" {}
variable "port" { type = number }
variable "model" {}
variable "mem" { default = 0.8 }
variable "warm" { default = true }
variable "warm_timeout" { default = "1m" }

server "qwen" {
  command = [var.fake]
  flags = {
    "model-path"          = var.model
    "port"                = var.port
    "mem-fraction-static" = var.mem
  }
  env = { FAKE_SGLANG = "load", FAKE_SGLANG_DECODE_INTERVAL = "100ms" }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "0s"
  }
  stop {
    timeout = "2s"
  }
  warm {
    enabled = var.warm
    timeout = var.warm_timeout
    margin  = "64MiB"
  }
  log_dir = var.logs
}
`

// warmHarness is a server harness on a checkpoint of its own under the test's directory.
type warmHarness struct {
	*srvHarness
	model string
	files []string
	root  string // the host root the kind reads /proc/meminfo under ("" the real one)
}

func newWarmHarness(t *testing.T, size int64) *warmHarness {
	t.Helper()
	h := &warmHarness{srvHarness: newSrvHarness(t)}
	h.model = filepath.Join(h.dir, "model")
	if err := os.MkdirAll(h.model, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.files, err = testbin.WriteWeights(h.model, 2, size/2); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *warmHarness) engine(vars ...string) *agent.Engine {
	h.t.Helper()
	vars = append([]string{"fake=" + fakeSGLang(h.t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port), "model=" + h.model}, vars...)
	return restest.Engine(h.t, h.dir, warmPlanText, kindsFor(resources.Machine{Root: h.root}), h.store, agent.Options{Memory: h.mem}, vars...)
}

func (h *warmHarness) apply(vars ...string) *agent.Step {
	h.t.Helper()
	return h.engine(vars...).Apply(context.Background(), nil).Steps[0]
}

// evict drops the checkpoint from the page cache: the next start is a cold one.
func (h *warmHarness) evict() {
	h.t.Helper()
	for _, f := range h.files {
		if err := warm.Evict(f); err != nil {
			h.t.Fatal(err)
		}
	}
}

// sample asks the server's /health every 5 ms (a warm-up of 256 MiB from a fast disk
// lasts a tenth of a second) until stop is closed; it returns when each question was
// sent and whether its answer was 200.
func sample(port int, stop <-chan struct{}) func() []healthSample {
	var mu sync.Mutex
	var out []healthSample
	done := make(chan struct{})
	c := &http.Client{Timeout: time.Second}
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			at := time.Now()
			resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
			ok := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				resp.Body.Close()
			}
			mu.Lock()
			out = append(out, healthSample{at, ok})
			mu.Unlock()
		}
	}()
	return func() []healthSample {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

type healthSample struct {
	at time.Time
	ok bool
}

// Issue 39: before the planned stop of a serving generation, the next generation's
// weights are read into the page cache (only what is not resident) while the old one
// keeps serving: the plan says so, the old generation answers every sample taken
// during the warm-up, and the new generation's record, status and metrics carry the
// figures. A warm-up on weights already warm reads (almost) nothing.
func TestWarmBeforeTheStopWhileTheOldServes(t *testing.T) {
	t.Parallel()
	const size = 256 << 20
	h := newWarmHarness(t, size)
	mustOK(t, h.apply())
	first := h.record()
	if first.Warm == nil || first.Warm.BeforeStop || first.Warm.Files != 3 {
		t.Errorf("first launch: warm-up %+v, want one beside the start over the two shards and the index", first.Warm)
	}

	h.evict()
	st := h.engine("mem=0.85").Plan(context.Background()).Steps[0]
	if st.Err != nil || len(st.Diff.Changes) == 0 || !strings.Contains(st.Diff.Changes[0].Note, "weights warmed before the stop") {
		t.Fatalf("plan of a flag change: %v, %+v; want the note that the weights are warmed first", st.Err, st.Diff)
	}
	stop := make(chan struct{})
	samples := sample(h.port, stop)
	mustOK(t, h.apply("mem=0.85"))
	close(stop)

	rec := h.record()
	w := rec.Warm
	if rec.Generation != 2 || w == nil || !w.BeforeStop || w.Error != "" || w.Skipped != "" {
		t.Fatalf("generation %d's warm-up: %+v", rec.Generation, w)
	}
	if w.Read < size*9/10 || w.Read != w.Bytes-w.ResidentBefore {
		t.Errorf("warm-up of evicted weights read %d of %d bytes (%d resident before)", w.Read, w.Bytes, w.ResidentBefore)
	}
	from, to := w.At, w.At.Add(time.Duration(w.Seconds*float64(time.Second)))
	during := 0
	for _, s := range samples() {
		if s.at.After(from) && s.at.Add(20*time.Millisecond).Before(to) {
			during++
			if !s.ok {
				t.Errorf("generation 1 did not answer /health at %s, during the warm-up (%s to %s)", s.at.Format(time.StampMilli), from.Format(time.StampMilli), to.Format(time.StampMilli))
			}
		}
	}
	t.Logf("warm-up: read %d of %d bytes in %.3f s; %d samples during it", w.Read, w.Bytes, w.Seconds, during)
	if during == 0 {
		t.Errorf("no sample fell within the warm-up (%s, %.3f s): it proves nothing", from.Format(time.StampMilli), w.Seconds)
	}

	sst := h.engine("mem=0.85").Status(context.Background()).Steps[0]
	if sst.Status == nil || !strings.Contains(fieldOf(sst.Status, "warm-up"), "before the stop") ||
		sst.Status.Metrics["warm_bytes"] != float64(w.Read) || sst.Status.Metrics["warm_seconds"] != w.Seconds {
		t.Errorf("status of generation 2: %+v", sst.Status)
	}

	// Already warm: the next change's warm-up reads under 1 % of the weights.
	mustOK(t, h.apply("mem=0.9"))
	if w := h.record().Warm; w == nil || w.Read > size/100 {
		t.Errorf("a warm-up on warm weights: %+v; want under 1 %% read", w)
	}
}

// A warm-up that fails (here: its timeout) never blocks the relaunch: the change is
// applied and verified, and the failure is recorded and shown.
func TestFailingWarmUpNeverBlocksTheRelaunch(t *testing.T) {
	t.Parallel()
	h := newWarmHarness(t, 64<<20)
	mustOK(t, h.apply())
	h.evict()
	mustOK(t, h.apply("mem=0.85", "warm_timeout=1ns"))
	rec := h.record()
	if rec.Generation != 2 || !rec.verified() {
		t.Fatalf("the relaunch after a failed warm-up: generation %d, verified %v", rec.Generation, rec.verified())
	}
	if w := rec.Warm; w == nil || !w.BeforeStop || !strings.Contains(w.Error, "warm.timeout 1ns") {
		t.Errorf("the failed warm-up is not recorded: %+v", w)
	}
	sst := h.engine("mem=0.85", "warm_timeout=1ns").Status(context.Background()).Steps[0]
	if got := fieldOf(sst.Status, "warm-up"); !strings.HasPrefix(got, "failed after") {
		t.Errorf("status says warm-up %q, want the failure", got)
	}
}

// The memory rule: weights that would not fit in 90 % of MemAvailable less the margin
// are not read, and the record says why; `warm { enabled = false }` reads nothing and
// says nothing.
func TestWarmSkippedOrOff(t *testing.T) {
	t.Parallel()
	h := newWarmHarness(t, 64<<20)
	h.root = t.TempDir()
	if err := os.MkdirAll(filepath.Join(h.root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.root, "proc/meminfo"), []byte("MemAvailable:      102400 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.evict()
	mustOK(t, h.apply())
	if w := h.record().Warm; w == nil || w.Read != 0 || !strings.Contains(w.Skipped, "90 % of MemAvailable 100.0 MiB less the margin 64.0 MiB") {
		t.Errorf("warm-up of 64 MiB with 100 MiB available and a 64 MiB margin: %+v, want skipped with the rule", w)
	}

	h.evict()
	st := h.engine("mem=0.85", "warm=false").Plan(context.Background()).Steps[0]
	if st.Err != nil || strings.Contains(st.Diff.Changes[0].Note, "warmed") {
		t.Errorf("plan with warm-ups off: %v, %+v", st.Err, st.Diff)
	}
	mustOK(t, h.apply("mem=0.85", "warm=false"))
	if w := h.record().Warm; w != nil {
		t.Errorf("warm { enabled = false }: a warm-up ran: %+v", w)
	}
}

// Which files a warm-up reads: the model paths of SGLang (and its draft model), vLLM
// and llama.cpp command lines; the warm block's values are checked where written.
func TestWarmPathsAndBlock(t *testing.T) {
	t.Parallel()
	cases := []struct {
		src  string
		want []string
	}{
		{`command = ["python3", "-m", "sglang.launch_server"]
  flags = { "model-path" = "/models/qwen", "speculative-draft-model-path" = "/models/draft" }`, []string{"/models/qwen", "/models/draft"}},
		{`command = ["vllm", "serve", "/models/qwen"]`, []string{"/models/qwen"}},
		{`command = ["vllm", "serve"]
  flags = { model = "/models/qwen" }`, []string{"/models/qwen"}},
		{`command = ["llama-server"]
  flags = { m = "/models/q4.gguf" }`, []string{"/models/q4.gguf"}},
		{`command = ["python3", "-m", "sglang.launch_server"]
  flags = { "model-path" = "Qwen/Qwen3-8B" }`, nil},
	}
	for _, c := range cases {
		rs, diags := restest.BindPlan("server \"s\" {\n  "+c.src+"\n}\n", kindsFor(resources.Machine{}))
		if diags.HasErrors() {
			t.Fatalf("%s: %v", c.src, diags)
		}
		if got := rs["server.s"].(*Server).weightPaths(); strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%s: weight paths %q, want %q", c.src, got, c.want)
		}
	}
	_, diags := restest.BindPlan("server \"s\" {\n  command = [\"x\"]\n  warm {\n    margin = \"lots\"\n  }\n}\n", kindsFor(resources.Machine{}))
	if !strings.Contains(diags.Error(), "Invalid warm.margin") {
		t.Errorf("margin = \"lots\": %v", diags)
	}
}

// Cold start: a launch that stops nothing serving (here the first, on weights evicted as
// after a reboot) runs the readers beside the engine's own load; the record says what
// they found and read, and a warm-up the launch outran is no failure.
func TestWarmBesideAColdStart(t *testing.T) {
	t.Parallel()
	const size = 128 << 20
	h := newWarmHarness(t, size)
	h.evict()
	mustOK(t, h.apply())
	w := h.record().Warm
	if w == nil || w.BeforeStop || w.Error != "" || w.Skipped != "" || w.Files != 3 {
		t.Fatalf("first launch on cold weights: warm-up %+v, want one beside the start", w)
	}
	if w.ResidentBefore > size/2 || w.Read+w.ResidentBefore > w.Bytes {
		t.Errorf("warm-up beside a cold start: %d of %d bytes resident when it looked, %d read", w.ResidentBefore, w.Bytes, w.Read)
	}
	for _, f := range h.files {
		if r, err := warm.Resident(f); err != nil || r < size/2-1<<20 {
			t.Errorf("%s: %d bytes resident once the server is ready (%v)", f, r, err)
		}
	} // The start is the ledger's first figure for these weights: the next cold start
	// runs without readers, to compare.
	key, err := warm.Key(h.files)
	if err != nil {
		t.Fatal(err)
	}
	if ok, why := warm.NewLedger(h.store.Dir()).Beside(key); ok || !strings.HasPrefix(why, "measuring one cold start") {
		t.Errorf("after a measured cold start with readers: beside %v (%q), want the next one without", ok, why)
	}
}

// Only a planned change waits for a warm-up before its stop: a repair (unhealthy,
// wedged) stops at once, since the old generation serves nothing; a migration keeps the
// old one and stops nothing.
func TestPlannedStopOnly(t *testing.T) {
	t.Parallel()
	prev := &serverRecord{Generation: 1, PID: 4711}
	change := func(r agent.Reason) agent.Change {
		return agent.Set("flags", 1, 2).Because(agent.Restarts, r)
	}
	cases := []struct {
		name string
		d    *agent.Diff
		want bool
	}{
		{"flag change", &agent.Diff{Changes: []agent.Change{change(agent.ReasonIdentity)}, Detail: &serverDetail{prev: prev, stop: true}}, true},
		{"unhealthy", &agent.Diff{Changes: []agent.Change{change(agent.ReasonUnhealthy)}, Detail: &serverDetail{prev: prev, stop: true}}, false},
		{"GPU fault", &agent.Diff{Changes: []agent.Change{change(agent.ReasonGPUFault)}, Detail: &serverDetail{prev: prev, stop: true}}, false},
		{"wedged and changed", &agent.Diff{Changes: []agent.Change{change(agent.ReasonWedged), change(agent.ReasonIdentity)}, Detail: &serverDetail{prev: prev, stop: true}}, false},
		{"migration", &agent.Diff{Changes: []agent.Change{change(agent.ReasonIdentity)}, Detail: &serverDetail{prev: prev, migrate: true}}, false},
		{"first launch", &agent.Diff{Changes: []agent.Change{change(agent.ReasonMissing)}, Detail: &serverDetail{}}, false},
	}
	for _, c := range cases {
		if got := plannedStop(c.d); got != c.want {
			t.Errorf("%s: planned stop %v, want %v", c.name, got, c.want)
		}
	}
}

// A cold start follows the ledger of cold starts on this filesystem (warm.Ledger): where
// only a start with readers was measured, this one runs without them to compare; where
// the readers measured slower, they stay away. Either way the record and status say why,
// nothing is read by the agent, and the start is added to the ledger.
func TestColdStartWithoutReadersWhereTheyMeasuredSlower(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		seed    func(l *warm.Ledger, key string)
		wantWhy string
	}{
		{"measuring", func(l *warm.Ledger, key string) {
			l.Record(key, true, 10, 1<<30, time.Now())
		}, "measuring one cold start without the readers on this filesystem, to compare (with them: 10.0 s/GiB)"},
		{"slower", func(l *warm.Ledger, key string) {
			l.Record(key, true, 100, 1<<30, time.Now())
			l.Record(key, false, 1, 1<<30, time.Now())
		}, "on this filesystem cold starts measured slower with the readers beside (100.0 s/GiB against 1.0 without)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const size = 128 << 20
			h := newWarmHarness(t, size)
			key, err := warm.Key(h.files)
			if err != nil {
				t.Fatal(err)
			}
			ledger := warm.NewLedger(h.store.Dir())
			tc.seed(ledger, key)
			h.evict()
			mustOK(t, h.apply())
			w := h.record().Warm
			if w == nil || w.Skipped != tc.wantWhy || w.Read != 0 {
				t.Fatalf("cold start: warm-up %+v, want none, skipped with %q", w, tc.wantWhy)
			}
			b, err := os.ReadFile(filepath.Join(h.store.Dir(), warm.LedgerFile))
			if err != nil || !strings.Contains(string(b), `"alone"`) {
				t.Errorf("the start without readers was not added to the ledger:\n%s", b)
			}
		})
	}
}
