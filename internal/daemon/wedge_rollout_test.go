package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// groupLivenessPlan is two fake servers a and b in rollout group g (max_unavailable =
// 1), each with livenessPlan's check; A_FAULTS are a's faults.
func groupLivenessPlan(aFaults string) string {
	var b strings.Builder
	b.WriteString("variable \"fake\" {}\nvariable \"root\" {}\nvariable \"port_a\" { type = number }\nvariable \"port_b\" { type = number }\n")
	for _, m := range []struct{ name, faults string }{{"a", aFaults}, {"b", ""}} {
		fmt.Fprintf(&b, `
server %q {
  command = [var.fake]
  flags   = { "model-path" = "${var.root}/model", "port" = var.port_%s, "enable-metrics" = true }
  env     = { FAKE_SGLANG = %q, FAKE_SGLANG_DECODE_INTERVAL = "200ms", HOME = var.root }
  ready {
    http    = "/health"
    timeout = "60s"
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
  rollout {
    group           = "g"
    max_unavailable = 1
  }
  log_dir = "${var.root}/logs"
}
`, m.name, m.name, m.faults)
	}
	return b.String()
}

func readLiveOf(t *testing.T, stateDir, addr string) liveRecord {
	t.Helper()
	var r liveRecord
	b, err := os.ReadFile(filepath.Join(stateDir, "resources", addr+".json"))
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil && !os.IsNotExist(err) {
		t.Logf("record: %v", err)
	}
	return r
}

// Issue 35, point 2: while a's planned restart is in flight (a slow start), b's engine
// wedges. b is down already: it counts as unavailable and is relaunched at once, never
// waiting for a's permit, within interval × failures + timeout + its start + 2 s and
// before a is verified; the loop says it found b wedged once.
func TestWedgeDuringAnotherMembersRestartIsRepairedAtOnce(t *testing.T) {
	t.Parallel()
	fake, root := fakeRoot(t)
	stateDir, planPath := "", ""
	vars := []string{"fake=" + fake, "root=" + root, "port_a=" + strconv.Itoa(testbin.FreePort(t)), "port_b=" + strconv.Itoa(testbin.FreePort(t))}
	base, logs := runReal(t, groupLivenessPlan(""), vars, func(c *Config) {
		stateDir, planPath = c.StateDir, c.PlanPath
		c.Interval = 3 * time.Second
	})
	waitLong(t, "a and b verified, b's liveness alive", 60*time.Second, func() bool {
		a, b := statusOf(t, base, "server.a"), statusOf(t, base, "server.b")
		return a.Status != nil && a.Status.Healthy && b.Status != nil && b.Status.Healthy &&
			strings.HasPrefix(field(b, "liveness"), "alive: /health_generate every 1s")
	})
	b1 := readLiveOf(t, stateDir, "server.b")
	start := b1.VerifiedAt.Sub(b1.LaunchedAt)

	// a's planned restart: its new generation takes 30 s to load.
	if err := os.WriteFile(planPath+".tmp", []byte(groupLivenessPlan("slow-start=30s")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(planPath+".tmp", planPath); err != nil {
		t.Fatal(err)
	}
	waitLong(t, "a's generation 2 launched", 60*time.Second, func() bool {
		a := readLiveOf(t, stateDir, "server.a")
		return a.Generation == 2 && a.VerifiedAt.IsZero()
	})
	if err := syscall.Kill(b1.PID, syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	wedged := time.Now()
	bound := 1*time.Second*3 + 2*time.Second + start + 2*time.Second // interval × failures + timeout + start + 2 s
	waitLong(t, "b's generation 2 verified", bound+60*time.Second, func() bool {
		b := readLiveOf(t, stateDir, "server.b")
		return b.Generation == 2 && !b.VerifiedAt.IsZero()
	})
	took := time.Since(wedged)
	a := readLiveOf(t, stateDir, "server.a")
	t.Logf("b wedged during a's restart, replaced in %s (bound %s; b's start %s); a verified: %v", took.Round(time.Millisecond), bound, start.Round(time.Millisecond), !a.VerifiedAt.IsZero())
	if took > bound {
		t.Errorf("b was replaced after %s, want within %s", took.Round(time.Millisecond), bound)
	}
	if a.Generation != 2 || !a.VerifiedAt.IsZero() {
		t.Errorf("b was replaced only after a's restart was verified (a: generation %d, verified %v)", a.Generation, a.VerifiedAt)
	}
	if rec := readLiveOf(t, stateDir, "server.b"); rec.Wedge == nil || rec.Wedge.Generation != 1 {
		t.Errorf("b's generation 2 does not keep the wedge: %+v", rec.Wedge)
	}
	l := logs.String()
	if n := strings.Count(l, "found wedged"); n != 1 {
		t.Errorf("the loop said %d times that it found b wedged, want once", n)
	}
	if strings.Contains(l, `msg="waiting for its rollout group" resource=server.b`) {
		t.Error("b's repair waited for its rollout group")
	}
}
