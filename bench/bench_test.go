// Package bench holds the benchmark scripts; these tests run short versions of those whose
// reading of what they drive could break unseen, so that a renamed metric, label or log
// line fails the suite instead of hanging a benchmark or emptying its figures
// (bench/repair.sh once waited forever for a series whose label had been renamed).
package bench

import (
	"context"
	"github.com/agent-dev/agent/internal/testbin"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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

// TestRelaunchBenchShortVersion runs bench/relaunch.sh twice on 64 MiB (a run whose gap
// the sampler missed is left out): the script's reading of the record (the warm-up's
// figures) and of the sampler must still work.
func TestRelaunchBenchShortVersion(t *testing.T) {
	testbin.Long(t, "builds the agent and relaunches a server")
	out := runScript(t, 5*time.Minute, []string{"RUNS=2", "MIB=64", "SHARDS=2"}, "relaunch.sh")
	// Not a timing assertion: the figures must exist, and the cold warm-up read the weights.
	if !regexp.MustCompile(`cold, warm-up on: +\d+ ms \([0-9.]+× warm`).Match(out) {
		t.Errorf("bench/relaunch.sh printed no gap with the warm-up:\n%s", out)
	}
	if !regexp.MustCompile(`cold-on: resident before 0 of 64 MiB, .*warm-up read 6[0-4] MiB`).Match(out) {
		t.Errorf("bench/relaunch.sh: the cold warm-up did not read the evicted weights:\n%s", out)
	}
}

// TestUpgradeBenchShortVersion runs bench/upgrade.sh for one round: what a user reads of
// it must be there: each of the three hosts upgraded with its figures (its servers'
// outage within its host permit), never two hosts down at once, and the verdict.
func TestUpgradeBenchShortVersion(t *testing.T) {
	testbin.Long(t, "runs etcd and three agents through a driver upgrade")
	out := runScript(t, 8*time.Minute, nil, "upgrade.sh", "1")
	hosts := regexp.MustCompile(`round 1 (h[123]): servers down (\d+\.\d)s, host permit held (\d+\.\d)s: `).FindAllSubmatch(out, -1)
	seen := map[string]bool{}
	for _, m := range hosts {
		down, _ := strconv.ParseFloat(string(m[2]), 64)
		held, _ := strconv.ParseFloat(string(m[3]), 64)
		// Not a timing assertion: each host was down, and only while it held its permit.
		if down <= 0 || held < down {
			t.Errorf("%s: servers down %.1f s, host permit held %.1f s\n%s", m[1], down, held, out)
		}
		seen[string(m[1])] = true
	}
	if len(seen) != 3 {
		t.Errorf("bench/upgrade.sh printed figures for %d hosts, want 3:\n%s", len(seen), out)
	}
	if !regexp.MustCompile(`UPGRADE RESULT: rounds=1 hosts=3 most_down_at_once=1 servers_down=\d+\.\ds–\d+\.\ds host_permit_held=\S+ fleet_total=\d+\.\ds–`).Match(out) ||
		!strings.Contains(string(out), "round 1: driver 570.172.08 → 580.95.05 on 3 hosts in ") {
		t.Errorf("bench/upgrade.sh printed no result line with one host down at a time:\n%s", out)
	}
}
