package daemon

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/internal/view"
)

// fakeRoot is the fake SGLang's binary and a root for a test's servers: the test fails
// if a process of the root outlives it, and its servers are killed when it ends.
func fakeRoot(t *testing.T) (fake, root string) {
	t.Helper()
	fake, root = testbin.FakeSGLang(t), t.TempDir()
	testbin.NoLeaks(t, root)
	t.Cleanup(func() { testbin.KillServers(root) })
	return fake, root
}

// runFake runs the loop on src with a fake SGLang server (vars: more of the plan's
// variables; fake, root and port are set) until the test ends, and kills what it left.
// It returns the loop's base URL, its log and its state directory.
func runFake(t *testing.T, src string, interval time.Duration, vars ...string) (string, *syncBuffer, string) {
	t.Helper()
	fake, root := fakeRoot(t)
	stateDir := ""
	vars = append([]string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t))}, vars...)
	base, logs := runReal(t, src, vars, func(c *Config) {
		stateDir = c.StateDir
		if interval > 0 {
			c.Interval = interval
		}
	})
	return base, logs, stateDir
}

// livenessPlan is serverPlan with a liveness check of the test's pace, /metrics on, and
// a batch line every 200 ms while the engine works.
const livenessPlan = `
variable "fake" {}
variable "root" {}
variable "port" { type = number }
variable "faults" { default = "" }
server "qwen" {
  command = [var.fake]
  flags   = { "model-path" = "${var.root}/model", "port" = var.port, "enable-metrics" = true }
  env     = { FAKE_SGLANG = var.faults, FAKE_SGLANG_DECODE_INTERVAL = "200ms", HOME = var.root }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "1s"
  }
  stop {
    timeout = "2s"
  }
  liveness {
    interval = "1s"
    timeout  = "2s"
    failures = 3
  }
  log_dir = "${var.root}/logs"
}
`

// liveRecord is what these tests read of the server's record.
type liveRecord struct {
	PID        int       `json:"pid"`
	Generation int       `json:"generation"`
	LaunchedAt time.Time `json:"launched_at"`
	VerifiedAt time.Time `json:"verified_at"`
	Wedge      *struct {
		Generation int    `json:"generation"`
		Evidence   string `json:"evidence"`
	} `json:"wedge"`
}

func readLive(t *testing.T, stateDir string) liveRecord {
	t.Helper()
	return readLiveOf(t, stateDir, "server.qwen")
}

// Issue 26, 6: under agent run a wedged engine (its /health still 200, no token comes
// out) is relaunched within interval × failures + timeout plus its stop and its start,
// with the evidence quoted in the agent's log, in /status and in the record. The resync
// (3 s) restarts the watch several times meanwhile: the judgement must survive it.
func TestWedgedServerIsRelaunchedUnderAgentRun(t *testing.T) {
	t.Parallel()
	base, logs, stateDir := runFake(t, livenessPlan, 3*time.Second)
	waitLong(t, "generation 1 verified", 60*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		return r.Error == "" && r.Status != nil && r.Status.Healthy && readLive(t, stateDir).Generation == 1
	})
	first := readLive(t, stateDir)
	start := first.VerifiedAt.Sub(first.LaunchedAt)
	waitLong(t, "the liveness check alive", 30*time.Second, func() bool {
		return strings.HasPrefix(field(statusOf(t, base, "server.qwen"), "liveness"), "alive: /health_generate every 1s (timeout 2s, 3 failures in a row)")
	})
	if err := syscall.Kill(first.PID, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	wedged := time.Now()
	bound := 1*time.Second*3 + 2*time.Second + 2*time.Second + start // interval × failures + timeout + stop + start
	waitLong(t, "generation 2 verified", 2*bound+30*time.Second, func() bool {
		rec := readLive(t, stateDir)
		return rec.Generation == 2 && !rec.VerifiedAt.IsZero()
	})
	took := time.Since(wedged)
	t.Logf("wedged engine replaced in %s (bound %s: start %s)", took.Round(time.Millisecond), bound, start.Round(time.Millisecond))
	if took > bound+3*time.Second { // the loop's refire and a loaded machine
		t.Errorf("the wedged engine was replaced after %s, want within %s", took, bound)
	}
	rec := readLive(t, stateDir)
	if rec.Wedge == nil || rec.Wedge.Generation != 1 || !strings.Contains(rec.Wedge.Evidence, "went unanswered") {
		t.Errorf("the record of generation 2 does not keep the wedge: %+v", rec.Wedge)
	}
	var r *view.JSONResource
	waitLong(t, "/status of generation 2", 30*time.Second, func() bool {
		r = statusOf(t, base, "server.qwen")
		return r.Status != nil && r.Status.Healthy && strings.HasPrefix(field(r, "generation"), "2")
	})
	if got := field(r, "replaced"); !strings.Contains(got, "generation 1 (pid "+strconv.Itoa(first.PID)+"), found wedged at") || !strings.Contains(got, "timed out after 2s") {
		t.Errorf("/status of generation 2: replaced %q", got)
	}
	log := logs.String()
	for _, want := range []string{"engine wedged: relaunching it", "3 liveness probes of /health_generate in a row went unanswered", "newest batch line", "generation tokens"} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's log lacks %q", want)
		}
	}
}

// Issue 26, 6: a busy engine (its probe answers only after 3 s, past the check's 2 s
// timeout, while batch lines and token counters move) runs for LIVENESS_BUSY_FOR (2
// minutes by default, 15 s at least) under agent run without a relaunch: degraded, never replaced.
func TestBusyServerIsNeverRelaunchedUnderAgentRun(t *testing.T) {
	t.Parallel()
	busyFor := 2 * time.Minute
	if v := os.Getenv("LIVENESS_BUSY_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LIVENESS_BUSY_FOR=%q: %v", v, err)
		}
		busyFor = max(d, 15*time.Second) // room for three failed probes and their verdict
	}
	base, logs, stateDir := runFake(t, livenessPlan, 3*time.Second, "faults=busy=3s")
	waitLong(t, "generation 1 verified", 60*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		return r.Error == "" && r.Status != nil && readLive(t, stateDir).Generation == 1 && field(r, "liveness") != ""
	})
	first := readLive(t, stateDir)
	end := time.Now().Add(busyFor)
	degraded := false
	for time.Now().Before(end) {
		if rec := readLive(t, stateDir); rec.PID != first.PID || rec.Generation != 1 {
			t.Fatalf("a busy engine was relaunched: generation %d, pid %d (was %d)", rec.Generation, rec.PID, first.PID)
		}
		r := statusOf(t, base, "server.qwen")
		if l := field(r, "liveness"); strings.HasPrefix(l, "wedged") {
			t.Fatalf("a busy engine judged wedged: %s", l)
		} else if strings.Contains(l, "making progress") {
			degraded = true
		}
		time.Sleep(time.Second)
	}
	if !degraded {
		t.Error("the busy engine's failed probes were never reported (degraded, making progress)")
	}
	if strings.Contains(logs.String(), "engine wedged") {
		t.Error("the agent's log calls a busy engine wedged")
	}
	if !strings.Contains(logs.String(), "liveness probe failed") {
		t.Error("the agent's log does not report the failed probes")
	}
}

// Issue 26, 6: a server without a liveness block gets its engine's default check under
// agent run (SGLang: /health_generate, 15 s, 20 s, 3).
func TestServerWithoutLivenessBlockGetsTheDefaultUnderAgentRun(t *testing.T) {
	t.Parallel()
	base, _, _ := runFake(t, serverPlan, 0, "settle=1s")
	waitLong(t, "the default liveness check", 60*time.Second, func() bool {
		return field(statusOf(t, base, "server.qwen"), "liveness") == "alive: /health_generate every 15s (timeout 20s, 3 failures in a row)"
	})
}
