package chaos_test

// The harness every chaos test runs on: one place for what they all do alike (the seed
// and the kill count, the step a failure names and its replay line, the agent started
// and reaped, the sampler that watches the servers, the kill loop of `agent run`, the
// wait on /status and the final accounting of server processes), so that a fix to one
// of them (a cleanup order, a zombie, a stale /status document) reaches all of them.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// chaosTest is one chaos test's run: its seed, kill count and step (every failure names
// them, with the command that replays it), a working directory of its own (work/plan,
// work/host: var.root and the servers' HOME, work/state), the agent it runs now
// (SIGKILLed by cleanup when a failure leaves it running) and every agent's output.
type chaosTest struct {
	t        *testing.T
	name     string // "chaos run": what its log lines and failures begin with
	killsEnv string // the variable that set kills, for the replay line
	kills    int
	seed     int64
	rng      *rand.Rand
	step     string
	// more, when set, is appended to every failure (the container test: incusd's log).
	more func() string

	work, planDir, host, state string
	agentBin                   string
	env                        []string // the agents' environment (nil: the test's)

	running    *exec.Cmd
	transcript bytes.Buffer // every agent's output, for the launch accounting
	watch      *watcher
}

// newChaos starts a chaos test: it skips under -short, reads the kill count from killsEnv
// (default defKills) and the seed from CHAOS_SEED (default: the clock), registers
// NoLeaks on the working directory and a cleanup that kills what the test left running,
// and builds the agent.
func newChaos(t *testing.T, name, killsEnv string, defKills int) *chaosTest {
	t.Helper()
	testbin.Long(t, "chaos")
	c := &chaosTest{t: t, name: name, killsEnv: killsEnv, kills: envCount(t, killsEnv, defKills), step: "setup"}
	c.seed = time.Now().UnixNano()
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		c.seed = n
	}
	c.rng = rand.New(rand.NewSource(c.seed))
	c.work = t.TempDir()
	testbin.NoLeaks(t, c.work)
	c.planDir, c.host, c.state = filepath.Join(c.work, "plan"), filepath.Join(c.work, "host"), filepath.Join(c.work, "state")
	must(t, os.MkdirAll(c.planDir, 0o755))
	must(t, os.MkdirAll(c.host, 0o755))
	// One cleanup, in this order: the agent first (else it could launch a server again
	// after the servers were killed), then the sampler, then the servers.
	t.Cleanup(func() {
		if c.running != nil && c.running.Process != nil {
			c.running.Process.Signal(syscall.SIGKILL) // by PID: the agent this test started
			c.running.Wait()
		}
		if c.watch != nil {
			c.watch.stop()
		}
		testbin.KillServers(c.work)
	})
	c.agentBin = testbin.Agent(t)
	return c
}

// envCount reads a positive count from the environment variable name (def when unset).
func envCount(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// envDuration reads a duration from the environment variable name (def when unset).
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration such as 1m", name, v)
	}
	return d
}

// fail ends the test naming the seed, the step, and how to replay it.
func (c *chaosTest) fail(format string, args ...any) {
	c.t.Helper()
	msg := fmt.Sprintf(format, args...)
	if c.more != nil {
		msg += "\n" + c.more()
	}
	c.t.Fatalf("%s seed %d, step %s: %s\nreplay: CHAOS_SEED=%d %s=%d go test ./test/chaos -run '^%s$' -v",
		c.name, c.seed, c.step, msg, c.seed, c.killsEnv, c.kills, c.t.Name())
}

// copyPlan copies files (source path → name) into the plan directory.
func (c *chaosTest) copyPlan(files map[string]string) {
	for src, name := range files {
		b, err := os.ReadFile(src)
		must(c.t, err)
		must(c.t, os.WriteFile(filepath.Join(c.planDir, name), b, 0o644))
	}
}

// start starts the agent with args (its own process group, so that a kill by PID hits
// the agent alone); reap it.
func (c *chaosTest) start(args ...string) (*exec.Cmd, *bytes.Buffer) {
	c.t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(c.agentBin, args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.fail("start agent %s: %v", args[0], err)
	}
	c.running = cmd
	return cmd, &out
}

// reap waits for the agent started by start, SIGKILLing it after limit; it returns the
// exit code and whether the kill came first, and keeps its output in the transcript.
func (c *chaosTest) reap(cmd *exec.Cmd, out *bytes.Buffer, limit time.Duration) (rc int, killed bool) {
	c.t.Helper()
	rc, killed, err := reap(cmd, limit)
	c.running = nil
	c.transcript.Write(out.Bytes())
	if err != nil {
		c.fail("agent: %v", err)
	}
	return rc, killed
}

// killRuns starts `agent run` kills times, each with the arguments args(k) gives, and
// SIGKILLs it after a random delay below maxDelay, as systemd's Restart=always would
// find it; after each kill every state file must parse. note(k), called before the
// delay is drawn, says what the step is about ("epoch 2, "), or nothing.
func (c *chaosTest) killRuns(maxDelay time.Duration, args func(k int) (note string, args []string)) {
	c.t.Helper()
	for k := 1; k <= c.kills; k++ {
		note, a := args(k)
		delay := time.Duration(c.rng.Int63n(int64(maxDelay)))
		c.step = fmt.Sprintf("kill %d/%d (%safter %v)", k, c.kills, note, delay)
		cmd, out := c.start(a...)
		rc, killed := c.reap(cmd, out, delay)
		if !killed {
			c.fail("agent run ended by itself (exit %d) before its kill:\n%s", rc, out)
		}
		if err := stateWhole(c.state); err != nil {
			c.fail("%v", err)
		}
	}
}

// stop ends a running `agent run` with SIGTERM, as systemd stops it: it must exit
// within a minute.
func (c *chaosTest) stop(cmd *exec.Cmd, out *bytes.Buffer) {
	c.t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	if _, killed, err := reap(cmd, 60*time.Second); err != nil || killed {
		c.fail("agent run did not stop on SIGTERM (%v)", err)
	}
	c.running = nil
	c.transcript.Write(out.Bytes())
}

// waitStatus asks `agent run`'s /status on listen every 100 ms until done holds for the
// document (decoded fresh each time: decoding into the last one kept an "error" that the
// new answer omits, so a resource that had waited for its dependency looked as if it
// still did), failing with explain's words after limit.
func waitStatus[T any](c *chaosTest, listen string, limit time.Duration, done func(*T) bool, explain func(*T) string) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	var doc T
	for {
		if resp, err := http.Get("http://" + listen + "/status"); err == nil {
			var fresh T
			json.NewDecoder(resp.Body).Decode(&fresh)
			resp.Body.Close()
			doc = fresh
			if done(&doc) {
				return
			}
		}
		if time.Now().After(deadline) {
			c.fail("%s", explain(&doc))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// watcher samples this test's server processes every 20 ms and keeps the most alive at
// once.
type watcher struct {
	mu       sync.Mutex
	maxAlive int
	twoAlive string
	quit     chan struct{}
	done     chan struct{}
	once     sync.Once
}

// watchServers starts the sampler; checkNeverTwo reads what it saw.
func (c *chaosTest) watchServers() {
	w := &watcher{quit: make(chan struct{}), done: make(chan struct{})}
	c.watch = w
	go func() {
		defer close(w.done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.quit:
				return
			case <-tick.C:
				procs := serverProcs(c.work)
				live := 0
				for pid := range procs {
					if !isZombie(pid) {
						live++
					}
				}
				w.mu.Lock()
				if live > w.maxAlive {
					w.maxAlive = live
					if live > 1 {
						w.twoAlive = fmt.Sprint(procs)
					}
				}
				w.mu.Unlock()
			}
		}
	}()
}

func (w *watcher) stop() {
	w.once.Do(func() { close(w.quit) })
	<-w.done
}

// checkNeverTwo fails if the sampler ever saw two of this run's servers alive at once.
func (c *chaosTest) checkNeverTwo() {
	c.t.Helper()
	c.watch.mu.Lock()
	ma, two := c.watch.maxAlive, c.watch.twoAlive
	c.watch.mu.Unlock()
	if ma > 1 {
		c.fail("two server processes alive at once: %s", two)
	}
}

// alive is this run's live servers (PID → marker), waiting up to wait for more than one
// to become one (zombies of killed agents are reaped by init, and a killed agent's
// server being stopped may take a moment).
func (c *chaosTest) alive(wait time.Duration) map[int]string {
	deadline := time.Now().Add(wait)
	for {
		alive := map[int]string{}
		for pid, m := range serverProcs(c.work) {
			if !isZombie(pid) {
				alive[pid] = m
			}
		}
		if len(alive) <= 1 || !time.Now().Before(deadline) {
			return alive
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serverRecord is what the final checks read of server.qwen's state record.
type serverRecord struct {
	PID        int               `json:"pid"`
	Generation int               `json:"generation"`
	Marker     string            `json:"marker"`
	VerifiedAt string            `json:"verified_at"`
	Env        map[string]string `json:"env"`
	RevertOf   int               `json:"revert_of"`
	Rejected   *struct {
		Generation int `json:"generation"`
	} `json:"rejected"`
}

// checkOneServer reads server.qwen's record and fails unless exactly one of this run's
// servers is alive (after up to wait for zombies and stops), the recorded one with the
// recorded marker (an adopted process, a launch whose record a kill prevented, found
// again by its exact argv, has none recorded), and unless the sampler never saw two
// alive at once. It returns the record and its bytes.
func (c *chaosTest) checkOneServer(wait time.Duration) (serverRecord, []byte) {
	c.t.Helper()
	var rec serverRecord
	b, err := os.ReadFile(filepath.Join(c.state, "resources", "server.qwen.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		c.fail("server state: %v %q", err, b)
	}
	if alive := c.alive(wait); len(alive) != 1 || alive[rec.PID] == "" || rec.Marker != "" && alive[rec.PID] != rec.Marker {
		c.fail("want exactly one server process, pid %d (%s), the recorded one; alive: %v", rec.PID, rec.Marker, alive)
	}
	c.checkNeverTwo()
	return rec, b
}

// launches counts, per generation, the launches of server.qwen the agents logged.
func (c *chaosTest) launches() map[int]int {
	launched := map[int]int{}
	for _, m := range regexp.MustCompile(`msg=launched resource=server.qwen generation=(\d+)`).FindAllStringSubmatch(c.transcript.String(), -1) {
		g, _ := strconv.Atoi(m[1])
		launched[g]++
	}
	return launched
}

// checkOneLaunchEach fails if a generation was launched twice or a log generation holds
// two server starts.
func (c *chaosTest) checkOneLaunchEach(launched map[int]int) {
	c.t.Helper()
	for g, n := range launched {
		if n > 1 {
			c.fail("generation %d launched %d times", g, n)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(c.host, "logs", "qwen.*.log"))
	for _, p := range logs {
		if n := countStarts(p); n > 1 {
			c.fail("%s holds %d server starts: a log generation was reused", p, n)
		}
	}
}

// serverProcs lists this run's qwen servers (testbin.Servers, by PID and environ only):
// those whose HOME lies under dir (their default HOME is <state dir>/home).
func serverProcs(dir string) map[int]string {
	found := testbin.Servers(dir)
	maps.DeleteFunc(found, func(_ int, marker string) bool {
		return !strings.HasPrefix(marker, "AGENT_SERVER=server.qwen#")
	})
	return found
}

// isZombie reports a process that has exited but was not reaped yet (its parent, a
// killed agent, is gone; init reaps it soon).
func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// countStarts is how many server starts one log file holds (the fake, like SGLang, prints
// its server_args once per process).
func countStarts(p string) int {
	f, err := os.Open(p)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "server_args=") {
			n++
		}
	}
	return n
}

// reap waits for cmd, SIGKILLing it (by PID, the agent alone) after limit. It returns
// the exit code (-1 when a SIGKILL ended it) and whether the kill came first; err is a
// failure to wait, not an exit status.
func reap(cmd *exec.Cmd, limit time.Duration) (rc int, killed bool, err error) {
	res := make(chan error, 1)
	go func() { res <- cmd.Wait() }()
	select {
	case err = <-res:
	case <-time.After(limit):
		cmd.Process.Signal(syscall.SIGKILL) // a no-op once Wait has reaped it
		err, killed = <-res, true
	}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() && st.Signal() == syscall.SIGKILL {
			return -1, killed, nil
		}
		return ee.ExitCode(), false, nil
	case err != nil:
		return 0, false, err
	}
	return 0, false, nil
}

// stateWhole returns an error naming the first state file (*.json under dir) that does
// not parse: state is never half-written. A missing dir is fine (killed before it was
// made).
func stateWhole(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == dir {
			return nil
		}
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".json") || strings.HasPrefix(d.Name(), ".") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if !json.Valid(b) {
			return fmt.Errorf("state file %s is half-written: %q", p, b)
		}
		return nil
	})
}

func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
