// Package bench holds the benchmark scripts; this test runs the short version of the one
// that drives `agent run` through its /metrics, so that a renamed metric or label fails
// the suite instead of hanging the benchmark (bench/repair.sh once waited forever for a
// series whose label had been renamed).
package bench

import (
	"github.com/agent-dev/agent/internal/testbin"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"
)

func TestRepairBenchShortVersion(t *testing.T) {
	testbin.Long(t, "builds the agent and runs it")
	cmd := exec.Command("bash", "repair.sh")
	cmd.Env = append(os.Environ(), "RUNS=1", "BLOB_MIB=8", "RATE_KIB=512", "IDLE_SECONDS=0")
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			cmd.Process.Kill()
		}
	}()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench/repair.sh: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`the agent's own share median (-?\d+) ms`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("bench/repair.sh printed no share of the agent:\n%s", out)
	}
	// Not a timing assertion (machines are noisy): the figure must exist and be sane.
	if ms, _ := strconv.Atoi(string(m[1])); ms < 0 || ms > 60000 {
		t.Errorf("the agent's own share of a repair: %d ms\n%s", ms, out)
	}
}

// TestRelaunchBenchShortVersion runs bench/relaunch.sh twice on 64 MiB (a run whose gap
// the sampler missed is left out): the script's reading of the record (the warm-up's
// figures) and of the sampler must still work.
func TestRelaunchBenchShortVersion(t *testing.T) {
	testbin.Long(t, "builds the agent and relaunches a server")
	cmd := exec.Command("bash", "relaunch.sh")
	cmd.Env = append(os.Environ(), "RUNS=2", "MIB=64", "SHARDS=2")
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			cmd.Process.Kill()
		}
	}()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bench/relaunch.sh: %v\n%s", err, out)
	}
	// Not a timing assertion: the figures must exist, and the cold warm-up read the weights.
	if !regexp.MustCompile(`cold, warm-up on: +\d+ ms \([0-9.]+× warm`).Match(out) {
		t.Errorf("bench/relaunch.sh printed no gap with the warm-up:\n%s", out)
	}
	if !regexp.MustCompile(`cold-on: resident before 0 of 64 MiB, .*warm-up read 6[0-4] MiB`).Match(out) {
		t.Errorf("bench/relaunch.sh: the cold warm-up did not read the evicted weights:\n%s", out)
	}
}
