package chaos_test

// TestChaosContainer: crash anywhere (issue 9, point 1), the container half. The plan of
// testdata/container.hcl (examples/containers/containers.hcl with the busybox image, a
// unique instance name, a second disk and a file) is applied against a private incusd
// again and again while `agent apply` is SIGKILLed at random points. After every converged
// apply the plan changes: user.epoch always (an in-place update), the "cache" disk comes
// or goes (an in-place device change), limits.kernel.nofile in epochs 2, 6, 10, … (a
// restart), the file's content always; and before epochs 4, 8, … the test deletes the
// instance behind the agent's back (a creation). So kills land in creations, in-place
// updates and restarts.
// After every kill:
//
//   - state is never half-written: every *.json under the state dir parses;
//   - the daemon holds no instance but this run's, and at most one of it;
//   - the disks' host data is intact: every file the test put in their source
//     directories holds its content, none is gone;
//   - the file holds a content the plan declared in this epoch or an earlier one.
//
// After every apply that was not killed (and after the final one): it exited 0 (so it
// took the lock with --lock-timeout 0, a kill never leaves the lock stuck), a
// `plan --lock-timeout 0` says "No changes.", and the instance exists exactly once,
// running, with the plan's config, devices and description.
//
// CHAOS_KILLS (default 50) and CHAOS_SEED work as for TestChaos; CHAOS_CONTAINER_RESTARTS=0
// leaves the restart epochs out. Without incusd it skips
// (fails with CI=true), like every test on the private daemon.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/testbin"
)

// incusd is the private Incus daemon of this test binary (only TestChaosContainer uses it).
var incusd = incustest.NewShared()

func TestMain(m *testing.M) { os.Exit(incusd.Run(m)) }

// ctrMaxDelay bounds the pause before a kill: an update apply takes ≈ 0.2 s, a restart
// or a creation ≈ 1 s on 2 cores, so most kills land inside one of them.
const ctrMaxDelay = 1000 * time.Millisecond

func TestChaosContainer(t *testing.T) {
	t.Parallel()
	testbin.Long(t, "chaos")
	d := incusd.Start(t) // before newChaos: NoLeaks then judges after the instance's cleanup
	name := d.InstanceName(t)
	c := newChaos(t, "chaos container", "CHAOS_KILLS", 50)
	c.more = func() string { return d.LogTail(15) }
	t.Logf("chaos container: seed %d (CHAOS_SEED=%d replays it), %d kills, instance %s", c.seed, c.seed, c.kills, name)
	if os.Getenv("CHAOS_CONTAINER_RESTARTS") == "0" {
		t.Log("chaos container: restarts off (CHAOS_CONTAINER_RESTARTS=0)")
	}
	fail := c.fail

	planSrc, err := os.ReadFile("testdata/container.hcl")
	must(t, err)
	planDir, state := c.planDir, c.state
	host := c.host // var.root: the disks' sources
	// The disks' host data: it must survive every kill untouched.
	hostData := map[string][32]byte{}
	for _, f := range []string{"weights/config.json", "weights/model-00001-of-00001.safetensors", "cache/kv/blocks.bin"} {
		p := filepath.Join(host, f)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		b := bytes.Repeat([]byte(f+"\n"), 4096)
		must(t, os.WriteFile(p, b, 0o644))
		hostData[p] = sha256.Sum256(b)
	}

	epoch := 0
	// Restart epochs found two Incus behaviours the client now handles: a transient
	// "Invalid PID" 500 on the state read during a stop (retried), and "instance is busy
	// running a create operation" after a kill mid-create (waited for).
	restarts := os.Getenv("CHAOS_CONTAINER_RESTARTS") != "0"
	nofile := func(e int) int { // changes at epochs 2, 6, 10, …: a restart
		if !restarts {
			return 1024
		}
		return 1024 << (((e + 2) / 4) % 2)
	}
	hasCache := func(e int) bool { return e%2 == 1 }
	// writePlan writes epoch's plan: without the cache disk in even epochs.
	cacheBlock := regexp.MustCompile(`(?s)\n\s*# chaos:cache begin\n.*?# chaos:cache end\n`)
	writePlan := func() {
		src := planSrc
		if !hasCache(epoch) {
			src = cacheBlock.ReplaceAll(src, []byte("\n"))
		}
		must(t, os.WriteFile(filepath.Join(planDir, "container.hcl"), src, 0o644))
	}
	args := func(cmd string) []string {
		return []string{cmd, planDir, "--state-dir", state, "--log-level", "info", "--lock-timeout", "0",
			"-var", "incus_socket=" + d.Socket, "-var", "container_name=" + name, "-var", "root=" + host,
			"-var", "epoch=" + strconv.Itoa(epoch), "-var", "nofile=" + strconv.Itoa(nofile(epoch))}
	}
	// run starts the agent and reaps it, killing it after limit.
	run := func(cmdName string, limit time.Duration) (rc int, killed bool, out string) {
		t.Helper()
		cmd, buf := c.start(args(cmdName)...)
		rc, killed = c.reap(cmd, buf, limit)
		return rc, killed, buf.String()
	}

	ctx := context.Background()
	instances := func() []string {
		var urls []string
		if err := d.Client.Query(ctx, "GET", "/1.0/instances", nil, &urls); err != nil {
			fail("list instances: %v", err)
		}
		names := make([]string, 0, len(urls))
		for _, u := range urls {
			names = append(names, u[strings.LastIndex(u, "/")+1:])
		}
		return names
	}
	epochFile := filepath.Join(host, "weights", "epoch.txt")
	epochLine := regexp.MustCompile(`^epoch (\d+)\n$`)
	// checkHost is what must hold after every kill.
	checkHost := func() {
		t.Helper()
		if err := stateWhole(state); err != nil {
			fail("%v", err)
		}
		if names := instances(); len(names) > 1 || len(names) == 1 && names[0] != name {
			fail("the daemon holds %q; want at most this run's %s, once", names, name)
		}
		for p, want := range hostData {
			b, err := os.ReadFile(p)
			if err != nil || sha256.Sum256(b) != want {
				fail("disk source data %s is not intact: %d bytes, %v", p, len(b), err)
			}
		}
		if b, err := os.ReadFile(epochFile); err == nil {
			m := epochLine.FindSubmatch(b)
			if m == nil {
				fail("%s holds %q, which the plan never declared", epochFile, b)
			}
			if n, _ := strconv.Atoi(string(m[1])); n > epoch {
				fail("%s holds epoch %d, after epoch %d", epochFile, n, epoch)
			}
		}
	}
	// checkConverged is what must hold after an apply that was not killed.
	checkConverged := func() {
		t.Helper()
		checkHost()
		if rc, _, out := run("plan", applyLimit); rc != 0 || !strings.Contains(out, "No changes.") {
			fail("plan after a converged apply exited %d (want 0, no changes; the lock must be free):\n%s", rc, out)
		}
		if names := instances(); len(names) != 1 || names[0] != name {
			fail("the daemon holds %q; want exactly %s", names, name)
		}
		inst, _, err := d.Client.GetInstance(ctx, name)
		if err != nil {
			fail("get instance: %v", err)
		}
		if inst.StatusCode != incus.StatusRunning {
			fail("instance %s is %s, want running", name, inst.Status)
		}
		for k, v := range map[string]string{"user.agent.role": "inference", "user.epoch": strconv.Itoa(epoch), "limits.kernel.nofile": strconv.Itoa(nofile(epoch))} {
			if inst.Config[k] != v {
				fail("instance config[%q] = %q, want %q", k, inst.Config[k], v)
			}
		}
		want := map[string]map[string]string{"weights": {"type": "disk", "source": filepath.Join(host, "weights"), "path": "/models", "readonly": "true"}}
		if hasCache(epoch) {
			want["cache"] = map[string]string{"type": "disk", "source": filepath.Join(host, "cache"), "path": "/cache"}
		}
		if !maps.EqualFunc(inst.Devices, want, maps.Equal) {
			fail("instance devices = %v, want %v", inst.Devices, want)
		}
		if inst.Description != "chaos: SGLang inference container" || !slices.Equal(inst.Profiles, []string{"default"}) {
			fail("instance description %q, profiles %q", inst.Description, inst.Profiles)
		}
		if b, err := os.ReadFile(epochFile); err != nil || string(b) != fmt.Sprintf("epoch %d\n", epoch) {
			fail("%s = %q, %v; want epoch %d", epochFile, b, err, epoch)
		}
	}

	// What each epoch's first apply has to do, for the figures.
	phase := func() string {
		switch epoch % 4 {
		case 0:
			return "create"
		case 2:
			if restarts {
				return "restart"
			}
			return "update"
		default:
			return "update"
		}
	}
	began := time.Now()
	killsIn := map[string]int{}
	killed, converged, runs := 0, 0, 0
	writePlan()
	for killed < c.kills {
		runs++
		delay := time.Duration(c.rng.Int63n(int64(ctrMaxDelay)))
		c.step = fmt.Sprintf("run %d (kill %d/%d, epoch %d, %s, kill after %v)", runs, killed+1, c.kills, epoch, phase(), delay)
		rc, wasKilled, out := run("apply", delay)
		if wasKilled {
			killed++
			killsIn[phase()]++
			checkHost()
			continue
		}
		if rc != 0 {
			fail("apply exited %d without being killed:\n%s", rc, out)
		}
		converged++
		checkConverged()
		epoch++ // change the plan
		writePlan()
		if phase() == "create" {
			// The instance is lost (deleted behind the agent's back): the next apply
			// creates it again, so kills land in creations too.
			if err := d.Client.Kill(ctx, name); err != nil {
				fail("kill instance: %v", err)
			}
			if err := d.Client.DeleteInstance(ctx, name); err != nil {
				fail("delete instance: %v", err)
			}
		}
	}

	c.step = "final apply"
	if rc, _, out := run("apply", applyLimit); rc != 0 {
		fail("the apply after %d kills exited %d:\n%s", killed, rc, out)
	}
	checkConverged()
	c.step = "final checks"
	// The disk is really mounted, with the host's data: the file is seen inside.
	res, err := d.Client.Exec(ctx, name, incus.ExecRequest{Command: []string{"cat", "/models/epoch.txt"}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != fmt.Sprintf("epoch %d\n", epoch) {
		fail("cat /models/epoch.txt inside: %v %+v", err, res)
	}
	t.Logf("chaos container: seed %d: %d kills survived (%d in creations, %d in updates, %d in restarts), %d applies converged, %d epochs, %v",
		c.seed, killed, killsIn["create"], killsIn["update"], killsIn["restart"], converged, epoch+1, time.Since(began).Round(time.Second))
	fmt.Printf("CHAOS_CONTAINER kills=%d creates=%d updates=%d restarts=%d converged=%d seed=%d\n",
		killed, killsIn["create"], killsIn["update"], killsIn["restart"], converged, c.seed)
}
