package lifecycle

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/engines"
)

func f64(v float64) *float64 { return &v }
func intp(v int) *int        { return &v }

// The verdict table: a wedge needs every one of the last `failures` probes left
// unanswered by the engine and no progress since the first of them.
func TestLivenessWatchVerdicts(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	cfg := Liveness{Path: "/health_generate", Interval: 15 * time.Second, Timeout: 20 * time.Second, Failures: 3}
	timeout := func(i int) Probe {
		return Probe{At: t0.Add(time.Duration(i) * 15 * time.Second), Took: 20 * time.Second, Kind: ProbeTimeout}
	}
	still := func(i int) Progress {
		return Progress{At: t0.Add(time.Duration(i)*15*time.Second + 20*time.Second), LastBatch: t0.Add(-35 * time.Second),
			GenerationTokens: f64(1234), Requests: f64(56), Queued: intp(2), Running: intp(1)}
	}
	busy := func(i int) Progress {
		p := still(i)
		p.LastBatch = p.At.Add(-time.Second)
		p.GenerationTokens = f64(1234 + float64(i*40))
		return p
	}
	type step struct {
		probe Probe
		prog  Progress
		want  Verdict
	}
	cases := []struct {
		name  string
		steps []step
		say   string // in the last step's evidence
	}{
		{"wedged after three unanswered probes, nothing moved", []step{
			{timeout(0), still(0), Degraded}, {timeout(1), still(1), Degraded}, {timeout(2), still(2), Wedged}},
			"engine wedged: 3 liveness probes of /health_generate in a row went unanswered (10:00:00 timed out after 20s; 10:00:15 timed out after 20s; 10:00:30 timed out after 20s) and no progress since 10:00:00: newest batch line 09:59:25 (1m25s old), generation tokens 1234 unchanged, requests 56 unchanged, 1 running, 2 queued"},
		{"busy: probes fail, batch lines and tokens move", []step{
			{timeout(0), busy(0), Degraded}, {timeout(1), busy(1), Degraded}, {timeout(2), busy(2), Degraded}, {timeout(3), busy(3), Degraded}, {timeout(4), busy(4), Degraded}},
			"but the engine is making progress"},
		{"a 503 from a front end that gave up counts as unanswered", []step{
			{Probe{At: t0, Took: 20 * time.Second, Kind: ProbeStatus, Status: 503}, still(0), Degraded},
			{timeout(1), still(1), Degraded},
			{Probe{At: t0.Add(30 * time.Second), Took: 20 * time.Second, Kind: ProbeStatus, Status: 503}, still(2), Wedged}},
			"HTTP 503 after 20s"},
		{"a refused connection is not evidence of a wedge", []step{
			{timeout(0), still(0), Degraded}, {Probe{At: t0.Add(15 * time.Second), Kind: ProbeConnect}, still(1), Degraded}, {timeout(2), still(2), Degraded}},
			"not all for want of an answer"},
		{"a passed probe starts the count again", []step{
			{timeout(0), still(0), Degraded}, {timeout(1), still(1), Degraded}, {Probe{At: t0.Add(30 * time.Second), Kind: ProbePassed}, still(2), Alive},
			{timeout(3), still(3), Degraded}, {timeout(4), still(4), Degraded}},
			"2 of 3 before a verdict"},
		{"progress that stops: wedged once the window holds no progress", []step{
			{timeout(0), busy(0), Degraded}, {timeout(1), busy(1), Degraded}, {timeout(2), busy(2), Degraded},
			{timeout(3), busy(2), Degraded}, {timeout(4), busy(2), Degraded}, {timeout(5), busy(2), Wedged}},
			"no progress since 10:00:45"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewLivenessWatch(cfg)
			var say string
			for i, s := range c.steps {
				var got Verdict
				got, say = w.Judge(s.probe, s.prog)
				if got != s.want {
					t.Fatalf("step %d: %s (%s), want %s", i, got, say, s.want)
				}
			}
			if !strings.Contains(say, c.say) {
				t.Errorf("evidence %q lacks %q", say, c.say)
			}
		})
	}
}

// Against the real fake: a wedged engine (its front end's /health still 200) is judged
// wedged from its probes, its log and its /metrics; a busy one is slow, never wedged.
func TestLivenessAgainstTheFake(t *testing.T) {
	t.Parallel()
	cfg := Liveness{Path: "/health_generate", Interval: 0, Timeout: 1500 * time.Millisecond, Failures: 2}
	watch := func(t *testing.T, faults string, rounds int, wedge bool) (Verdict, string) {
		l, o := options(t, faults, "--enable-metrics")
		o.Spec.Env["SGLANG_HEALTH_CHECK_TIMEOUT"] = "30"
		x, err := l.Launch(ctx(t), o)
		if err != nil {
			t.Fatal(err)
		}
		if wedge {
			if err := syscall.Kill(x.ID.PID, syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.ProbeHTTP(ctx(t), o.Port, "/health"); err != nil {
			t.Fatalf("/health: %v (the front end must keep answering)", err)
		}
		w := NewLivenessWatch(cfg)
		var v Verdict
		var say string
		for i := 0; i < rounds; i++ {
			time.Sleep(300 * time.Millisecond) // room for batch lines between probes
			p := l.ProbeLiveness(ctx(t), o.Port, cfg, time.Now)
			b, err := os.ReadFile(x.LogPath)
			if err != nil {
				t.Fatal(err)
			}
			fromLog, err := engines.ScanMetrics(context.Background(), strings.NewReader(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			scraped, err := l.Metrics(ctx(t), o.Port)
			if err != nil {
				t.Fatal(err)
			}
			v, say = w.Judge(p, ProgressOf(fromLog, scraped, time.Now()))
			if v == Wedged {
				break
			}
		}
		return v, say
	}
	t.Run("wedged", func(t *testing.T) {
		t.Parallel()
		v, say := watch(t, "", 4, true)
		if v != Wedged || !strings.Contains(say, "timed out after") || !strings.Contains(say, "unchanged") {
			t.Errorf("a wedged engine judged %s: %s", v, say)
		}
	})
	t.Run("busy", func(t *testing.T) {
		t.Parallel()
		v, say := watch(t, "busy=3s", 4, false)
		if v != Degraded || !strings.Contains(say, "making progress") {
			t.Errorf("a busy engine judged %s: %s", v, say)
		}
	})
}
