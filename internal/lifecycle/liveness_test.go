package lifecycle

import (
	"fmt"
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
		return Progress{At: t0.Add(time.Duration(i)*15*time.Second + 20*time.Second), Observed: true, Batches: 7, LastBatch: t0.Add(-35 * time.Second),
			GenerationTokens: f64(1234), Requests: f64(56), Queued: intp(2), Running: intp(1)}
	}
	busy := func(i int) Progress {
		p := still(i)
		p.LastBatch, p.Batches = p.At.Add(-time.Second), 7+i
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
		{"progress that cannot be observed is never a wedge", []step{
			{timeout(0), Progress{At: t0}, Degraded}, {timeout(1), Progress{At: t0}, Degraded}, {timeout(2), Progress{At: t0}, Degraded}, {timeout(3), Progress{At: t0}, Degraded}},
			"progress cannot be observed"},
		{"batch lines within one second of each other still count", []step{
			{timeout(0), still(0), Degraded}, {timeout(1), func() Progress { p := still(1); p.Batches++; return p }(), Degraded},
			{timeout(2), func() Progress { p := still(2); p.Batches += 2; return p }(), Degraded}},
			"making progress (2 new batch lines"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewLivenessWatch(cfg)
			var say string
			for i, s := range c.steps {
				var got Verdict
				before := s.prog // as each probe is sent, the engine shows what the last answer saw
				if i > 0 {
					before = c.steps[i-1].prog
				}
				got, say = w.Judge(s.probe, before, s.prog)
				if got != s.want {
					t.Fatalf("step %d: %s (%s), want %s", i, got, say, s.want)
				}
			}
			if !strings.Contains(say, c.say) {
				t.Errorf("evidence %q lacks %q", say, c.say)
			}
			if busy := strings.Contains(say, "making progress"); w.Progressing() != busy {
				t.Errorf("Progressing() = %v after %q", w.Progressing(), say)
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
		follow := FollowLog(x.LogPath)
		progress := func() Progress {
			fromLog, d, ok, err := follow.Read()
			if err != nil || !ok || d != engines.SGLang {
				t.Fatalf("the fake's log: %v, %q %v", err, d, ok)
			}
			scraped, err := l.Metrics(ctx(t), o.Port)
			if err != nil {
				t.Fatal(err)
			}
			return ProgressOf(&fromLog, &scraped, time.Now())
		}
		for i := 0; i < rounds; i++ {
			time.Sleep(300 * time.Millisecond) // room for batch lines between probes
			before := progress()
			p := l.ProbeLiveness(ctx(t), o.Port, cfg, time.Now)
			v, say = w.Judge(p, before, progress())
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

// The follower reads only what a log grew by, finishes a line cut by a read, and starts
// over on a log that was truncated.
func TestLogFollowerReadsWhatTheLogGrewBy(t *testing.T) {
	path := t.TempDir() + "/server.log"
	batch := "[2026-12-03 10:00:0%d TP0] Decode batch, #running-req: 1, #token: 100, token usage: 0.01, cuda graph: True, gen throughput (token/s): 60.00, #queue-req: 0, \n"
	write := func(flag int, text string) {
		f, err := os.OpenFile(path, flag|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(text); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	f := FollowLog(path)
	if _, _, _, err := f.Read(); err == nil {
		t.Fatal("a missing log read without an error")
	}
	line1 := fmt.Sprintf(batch, 1)
	write(os.O_TRUNC, line1+line1[:40])
	m, d, ok, err := f.Read()
	if err != nil || m.Events != 1 || d != engines.SGLang || !ok {
		t.Fatalf("first read: %d batch lines, %q %v, %v; want 1, sglang", m.Events, d, ok, err)
	}
	write(os.O_APPEND, line1[40:]+fmt.Sprintf(batch, 2))
	if m, _, _, _ = f.Read(); m.Events != 3 || m.LastEvent.Second() != 2 {
		t.Fatalf("after the rest of a cut line and one more: %d batch lines, newest %s; want 3, :02", m.Events, m.LastEvent)
	}
	if m, _, _, _ = f.Read(); m.Events != 3 {
		t.Fatalf("nothing appended, yet %d batch lines", m.Events)
	}
	write(os.O_TRUNC, "plain text\n")
	m, _, ok, _ = f.Read()
	if m.Events != 0 || ok {
		t.Fatalf("a truncated log kept %d batch lines (dialect known %v)", m.Events, ok)
	}
}
