package daemon

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// Issue 27, point 1, on a real tmpfs and real processes: with the disk of the state
// directory and the log directory full, a flag change never stops the healthy server
// (before, it stopped it, failed to record the next launch and launched nothing). The
// refusal names the full directory; the fault is the host's, so no backoff grows: once
// space returns, the change goes ahead at the next short try (before, 5 → 10 → 22 s).
func TestAFullStateDiskNeverStopsAHealthyServer(t *testing.T) {
	t.Parallel()
	for _, full := range []string{"state", "logs"} {
		t.Run(full, func(t *testing.T) {
			t.Parallel()
			fullDiskCase(t, full)
		})
	}
}

// fullDiskCase fills the filesystem of the state directory ("state") or of the server's
// log directory ("logs"), each on a tmpfs of its own.
func fullDiskCase(t *testing.T, full string) {
	fake := testbin.FakeSGLang(t)
	root, stateFS := t.TempDir(), t.TempDir()
	if full == "state" {
		stateFS = testbin.Tmpfs(t, "64m")
	} else {
		root = testbin.Tmpfs(t, "64m")
	}
	fullFS := map[string]string{"state": stateFS, "logs": root}[full]
	t.Cleanup(func() { testbin.KillServers(root) })
	stateDir, planPath := "", ""
	base, logs := runReal(t, serverPlan, []string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t)), "settle=200ms"},
		func(c *Config) {
			c.StateDir = filepath.Join(stateFS, "state")
			stateDir, planPath = c.StateDir, c.PlanPath
			c.BackoffMin, c.BackoffMax = time.Second, time.Minute
		})
	waitLong(t, "generation 1 verified", 60*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		return r.Error == "" && r.Status != nil && r.Status.Healthy && readRecord(stateDir).Generation == 1
	})
	first := readRecord(stateDir)
	testbin.Fill(t, filepath.Join(fullFS, "fill"))

	edited := strings.Replace(serverPlan, "HOME = var.root }", `HOME = var.root, CHANGED = "yes" }`, 1)
	if err := os.WriteFile(planPath, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	waitLong(t, "the change refused", 30*time.Second, func() bool {
		return strings.Contains(statusOf(t, base, "server.qwen").Error, "not stopping generation 1")
	})
	// Several tries with the disk full: none stops the server, none grows a backoff.
	time.Sleep(6 * time.Second)
	// The loop tries again every second, and /status shows a try in flight as what
	// happens now, without the last error: a read that lands on a try (6 s after the
	// first refusal, in step with the tries, it did once) looks again.
	r := statusOf(t, base, "server.qwen")
	for end := time.Now().Add(3 * time.Second); r.Error == "" && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
		r = statusOf(t, base, "server.qwen")
	}
	t.Logf("with the disk full: %s", r.Error)
	if !strings.Contains(r.Error, "less than the") || !strings.Contains(r.Error, fullFS) {
		t.Errorf("the refusal does not say which directory is full: %q", r.Error)
	}
	if err := syscall.Kill(first.PID, 0); err != nil {
		t.Fatalf("generation 1 (pid %d) was stopped with the disk full: %v", first.PID, err)
	}
	if g := readRecord(stateDir).Generation; g != 1 {
		t.Fatalf("generation %d recorded with the disk full", g)
	}
	if field(r, "next try") != "" || strings.Contains(logs.String(), "crash loop") {
		t.Errorf("a full disk armed the server's backoff: next try %q", field(r, "next try"))
	}

	if err := os.Remove(filepath.Join(fullFS, "fill")); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitLong(t, "generation 2 verified once space returned", 60*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		return r.Error == "" && r.Status != nil && r.Status.Healthy && readRecord(stateDir).Generation == 2
	})
	took := time.Since(freed)
	t.Logf("the change went ahead %s after space returned", took.Round(time.Millisecond))
	// One short try (1 s here), the relaunch and its verification; a backoff doubled
	// over the tries with the disk full would have waited 8 s or more.
	if took > 7*time.Second {
		t.Errorf("the change waited %s after space returned", took)
	}
}
