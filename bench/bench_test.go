// Package bench holds the benchmark scripts; these tests run short versions of those whose
// reading of what they drive could break unseen, so that a renamed metric, label or log
// line fails the suite instead of hanging a benchmark or emptying its figures
// (bench/repair.sh once waited forever for a series whose label had been renamed).
package bench

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// runScript runs bash SCRIPT ARGS here with env added to the test's, killed after limit,
// and returns what it printed; the test fails when the script does.
func runScript(t *testing.T, limit time.Duration, env []string, script string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{script}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second // the scripts' children may hold the output open
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench/%s: %v (limit %s)\n%s", script, err, limit, out)
	}
	return out
}

func TestRepairBenchShortVersion(t *testing.T) {
	testbin.Long(t, "builds the agent and runs it")
	out := runScript(t, 5*time.Minute, []string{"RUNS=1", "BLOB_MIB=8", "RATE_KIB=512", "IDLE_SECONDS=0"}, "repair.sh")
	m := regexp.MustCompile(`the agent's own share median (-?\d+) ms`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("bench/repair.sh printed no share of the agent:\n%s", out)
	}
	// Not a timing assertion (machines are noisy): the figure must exist and be sane.
	if ms, _ := strconv.Atoi(string(m[1])); ms < 0 || ms > 60000 {
		t.Errorf("the agent's own share of a repair: %d ms\n%s", ms, out)
	}
}

// TestRelaunchBenchShortVersion runs bench/relaunch.sh three times on 64 MiB (a run whose
// gap the sampler missed is left out): the script's reading of the record (the warm-up's
// figures) and of the sampler must still work. On 64 MiB the gap is about 100 ms, two
// samples at the bench's 50 ms: under a loaded suite the sampler missed every warm run
// of two once, so the short version samples every 10 ms.
func TestRelaunchBenchShortVersion(t *testing.T) {
	testbin.Long(t, "builds the agent and relaunches a server")
	out := runScript(t, 5*time.Minute, []string{"RUNS=3", "MIB=64", "SHARDS=2", "SAMPLE_MS=10"}, "relaunch.sh")
	// Not a timing assertion: the figures must exist, and the cold warm-up read the weights.
	if !regexp.MustCompile(`cold, warm-up on: +\d+ ms \([0-9.]+× warm`).Match(out) {
		t.Errorf("bench/relaunch.sh printed no gap with the warm-up:\n%s", out)
	}
	if !regexp.MustCompile(`cold-on: resident before 0 of 64 MiB, .*warm-up read 6[0-4] MiB`).Match(out) {
		t.Errorf("bench/relaunch.sh: the cold warm-up did not read the evicted weights:\n%s", out)
	}
}
