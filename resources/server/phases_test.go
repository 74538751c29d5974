package server

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// The rule a start's status and log follow: more than 1.5× the previous start of the
// same identity (and 10 s more) says so, naming the phase that grew most; a first start,
// another identity or a small difference say nothing.
func TestSlowerStart(t *testing.T) {
	t.Parallel()
	start := func(identity string, took time.Duration, weights, graphs time.Duration) *startRecord {
		return &startRecord{Generation: 3, Identity: identity, Took: took, Phases: []startPhase{
			{Phase: engines.PhaseWeights, Took: weights}, {Phase: engines.PhaseCUDAGraphs, Took: graphs}, {Phase: engines.PhaseReady, Took: took - weights - graphs},
		}}
	}
	prev := start("a", 5*time.Minute+2*time.Second, 3*time.Minute+30*time.Second, time.Minute)
	cases := []struct {
		name      string
		cur, prev *startRecord
		want      string
	}{
		{"first start", prev, nil, ""},
		{"1.4×", start("a", 7*time.Minute, 5*time.Minute, time.Minute), prev, ""},
		{"1.5× exactly", start("a", 7*time.Minute+33*time.Second, 5*time.Minute, time.Minute), prev, ""},
		{"1.6×", start("a", 8*time.Minute+3*time.Second, 3*time.Minute+40*time.Second, 3*time.Minute+50*time.Second), prev,
			"start took 8m3s, 1.6× the previous start of this identity (5m2s, generation 3): CUDA graphs 3m50s (was 1m0s)"},
		{"1.8×, weights grew most", start("a", 9*time.Minute+12*time.Second, 7*time.Minute+40*time.Second, time.Minute), prev,
			"start took 9m12s, 1.8× the previous start of this identity (5m2s, generation 3): weights 7m40s (was 3m30s)"},
		{"another identity", start("b", 9*time.Minute+12*time.Second, 7*time.Minute+40*time.Second, time.Minute), prev, ""},
		{"3× but 4 s more", start("a", 6*time.Second, 4*time.Second, time.Second), start("a", 2*time.Second, time.Second, 0), ""},
		{"no phases", &startRecord{Identity: "a", Took: 20 * time.Minute}, prev,
			"start took 20m0s, 4.0× the previous start of this identity (5m2s, generation 3)"},
	}
	for _, c := range cases {
		if got := slowerStart(c.cur, c.prev); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

// Issue 26, point 3: a launch's phases are read from its log once, when it verified, and
// kept in its record; status shows them (fields and the start_phase_seconds series)
// from the record even once the log is gone; a relaunch of the same identity keeps the
// previous start, and one much slower than it says so in the log and in status.
func TestServerStartPhasesRecorded(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	var logs bytes.Buffer
	engine := func() *agent.Engine {
		vars := []string{"fake=" + fakeSGLang(t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port), "faults=slow-start=11s", "ready_timeout=60s"}
		return restest.Engine(t, h.dir, srvPlan, kindsFor(resources.Machine{}), h.store, agent.Options{Log: slog.New(slog.NewTextHandler(&logs, nil))}, vars...)
	}
	mustOK(t, engine().Apply(context.Background(), nil).Steps[0])
	rec := h.record()
	if rec.Start == nil || rec.Start.Generation != 1 || rec.Start.Identity != startIdentity(&rec) || rec.PrevStart != nil {
		t.Fatalf("generation 1's start not recorded as its own: start %+v, previous %+v", rec.Start, rec.PrevStart)
	}
	if rec.Start.Took < 11*time.Second || rec.Start.Took != rec.ReadyAt.Sub(rec.LaunchedAt) { // both as recorded, wall clock
		t.Errorf("start took %s, want launch to ready (%s), at least the fake's 11 s", rec.Start.Took, rec.ReadyAt.Sub(rec.LaunchedAt))
	}
	took := map[engines.Phase]time.Duration{}
	for _, p := range rec.Start.Phases {
		took[p.Phase] = p.Took
	}
	if len(took) != 4 || took[engines.PhaseWeights] < 10*time.Second || took[engines.PhaseWeights] > 14*time.Second {
		t.Errorf("phases %+v: want all four, weights about the fake's 11 s", rec.Start.Phases)
	}

	// A record without its start (an older agent's, or a launch under way) shows the
	// phases the status's one pass over the log finds, and no total yet.
	older := rec
	older.Start = nil
	if err := h.store.Save("server.qwen", &older); err != nil {
		t.Fatal(err)
	}
	st := h.status("faults=slow-start=11s", "ready_timeout=60s").Status
	if got := fieldOf(st, "start: weights"); got != took[engines.PhaseWeights].String() || fieldOf(st, "start: total") != "" || len(st.Series) != 4 {
		t.Errorf("without a recorded start: start: weights = %q (want %s from the log), total %q, series %+v", got, took[engines.PhaseWeights], fieldOf(st, "start: total"), st.Series)
	}
	if err := h.store.Save("server.qwen", &rec); err != nil {
		t.Fatal(err)
	}

	// Status reads the record: with the log emptied it still shows the start.
	if err := os.Truncate(rec.LogPath, 0); err != nil {
		t.Fatal(err)
	}
	st = h.status("faults=slow-start=11s", "ready_timeout=60s").Status
	if got := fieldOf(st, "start: weights"); got != agent.Duration(took[engines.PhaseWeights]).String() {
		t.Errorf("status start: weights = %q, want %s (fields %+v)", got, took[engines.PhaseWeights], st.Fields)
	}
	// Rounded for people (issue 35: "1.1s", not "1.106489514s"); exact for machines.
	if got := fieldOf(st, "start: total"); got != rec.Start.Took.Round(100*time.Millisecond).String() || st.Metrics["start_seconds"] != rec.Start.Took.Seconds() {
		t.Errorf("status start: total = %q, metric %v; want %s", got, st.Metrics["start_seconds"], rec.Start.Took.Round(100*time.Millisecond))
	}
	series := map[string]float64{}
	for _, s := range st.Series {
		if s.Name != "start_phase_seconds" || len(s.Labels) != 1 {
			t.Errorf("series %+v: want start_phase_seconds{phase}", s)
		}
		series[s.Labels["phase"]] = s.Value
	}
	if len(series) != 4 || series["ready"] != took[engines.PhaseReady].Seconds() || series["weights_loaded"] != took[engines.PhaseWeights].Seconds() {
		t.Errorf("series %v, want the recorded phases %v", series, took)
	}
	if fieldOf(st, "start: slower") != "" {
		t.Errorf("a first start says it is slower: %q", fieldOf(st, "start: slower"))
	}

	// The previous start, as if it had taken half a second: the relaunch (same identity,
	// after a death; the fake's 11 s again) is compared with it.
	rec.Start.Took = 500 * time.Millisecond
	for i := range rec.Start.Phases {
		rec.Start.Phases[i].Took = 100 * time.Millisecond
	}
	if err := h.store.Save("server.qwen", &rec); err != nil {
		t.Fatal(err)
	}
	if _, err := (proc.FS{}).Stop(context.Background(), rec.target(), syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	mustOK(t, engine().Apply(context.Background(), nil).Steps[0])
	now := h.record()
	if now.Generation != 2 || now.PrevStart == nil || now.PrevStart.Generation != 1 || now.PrevStart.Took != rec.Start.Took {
		t.Fatalf("generation %d keeps previous start %+v, want generation 1's (%s)", now.Generation, now.PrevStart, rec.Start.Took)
	}
	want := "weights " // the phase that grew most
	if l := logs.String(); !strings.Contains(l, "× the previous start of this identity") || !strings.Contains(l, want) {
		t.Errorf("the slower start is not in the log:\n%s", l)
	}
	st = h.status("faults=slow-start=11s", "ready_timeout=60s").Status
	if got := fieldOf(st, "start: slower"); !strings.HasPrefix(got, "took ") || !strings.Contains(got, "generation 1): "+want) {
		t.Errorf("status start: slower = %q", got)
	}
	if !st.Healthy {
		t.Errorf("a slow start made the server unhealthy: %s", st.Summary)
	}
}
