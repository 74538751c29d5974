package chaos_test

// TestChaosRun: the chaos suite against `agent run` (issue 12, point 7d). The same plan
// as TestChaos (the quickstart plus a throttled download) runs under the reconcile loop,
// which is SIGKILLed at random moments and restarted at once, as systemd's
// Restart=always does; now and then the restart brings a new plan (a new blob and a new
// --mem-fraction-static), so kills land in downloads, verified stops and launches. Then
// the last daemon is left to converge, and:
//
//   - it converges: /status reports every resource verified, with no error;
//   - exactly one server runs, the one the state records, and never were two alive at
//     once (the sampler of TestChaos);
//   - one log generation per launch, each launched once; state files always whole;
//   - while it runs, a manual `agent apply` is refused at once, naming it.
//
// CHAOS_RUN_KILLS (default 15) sets the number of kills, CHAOS_SEED replays a run.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
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

func TestChaosRun(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: not in -short")
	}
	_, seed := chaosParams(t)
	kills := 15
	if v := os.Getenv("CHAOS_RUN_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CHAOS_RUN_KILLS=%q: want a positive number", v)
		}
		kills = n
	}
	t.Logf("chaos run: seed %d (CHAOS_SEED=%d replays it), %d kills", seed, seed, kills)
	rng := rand.New(rand.NewSource(seed))
	step := "setup"
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("chaos run seed %d, step %s: %s\nreplay: CHAOS_SEED=%d CHAOS_RUN_KILLS=%d go test ./test/chaos -run TestChaosRun -v",
			seed, step, fmt.Sprintf(format, args...), seed, kills)
	}

	root := repoRoot(t)
	work := t.TempDir()
	testbin.NoLeaks(t, work)
	agentBin, fakeBin := testbin.Agent(t), testbin.FakeSGLang(t)
	planDir := filepath.Join(work, "plan")
	must(t, os.MkdirAll(planDir, 0o755))
	for _, f := range [][2]string{
		{filepath.Join(root, "examples/quickstart/quickstart.hcl"), "quickstart.hcl"},
		{"testdata/download.hcl", "download.hcl"},
	} {
		b, err := os.ReadFile(f[0])
		must(t, err)
		must(t, os.WriteFile(filepath.Join(planDir, f[1]), b, 0o644))
	}
	host := filepath.Join(work, "host")
	state := filepath.Join(work, "state")
	must(t, os.MkdirAll(host, 0o755))
	port := testbin.FreePort(t)
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))

	srv := &blobServer{content: map[string][]byte{}, expect: map[string]int64{}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	model := testbin.QuickstartModel(t) // the quickstart's model directory
	epoch := 0
	setEpoch := func(e int) {
		srv.mu.Lock()
		srv.content["/blob/"+strconv.Itoa(e)] = blob(e)
		srv.mu.Unlock()
	}
	setEpoch(0)

	var (
		seenMu   sync.Mutex
		seen     = map[int]string{}
		maxAlive int
		twoAlive string
	)
	sample := func() {
		procs := serverProcs(work)
		seenMu.Lock()
		defer seenMu.Unlock()
		live := 0
		for pid, m := range procs {
			seen[pid] = m
			if !isZombie(pid) {
				live++
			}
		}
		if live > maxAlive {
			maxAlive = live
			if live > 1 {
				twoAlive = fmt.Sprint(procs)
			}
		}
	}
	stopSampler, samplerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampler:
				return
			case <-tick.C:
				sample()
			}
		}
	}()
	var running *exec.Cmd
	t.Cleanup(func() {
		if running != nil && running.Process != nil {
			running.Process.Signal(syscall.SIGKILL)
			running.Wait()
		}
		select {
		case <-stopSampler:
		default:
			close(stopSampler)
		}
		<-samplerDone
		testbin.KillServers(work)
	})

	args := func(cmd string, extra ...string) []string {
		mem := []string{"0.85", "0.8"}[epoch%2]
		a := []string{cmd, planDir, "--state-dir", state, "--log-level", "info",
			"-var", "root=" + host, "-var", "fake_sglang=" + fakeBin, "-var", "port=" + strconv.Itoa(port),
			"-var", "mem_fraction=" + mem, "-var", "metrics_listen=" + listen, "-var", "model_url=" + model.URL,
			"-var", "blob_url=" + hs.URL + "/blob/" + strconv.Itoa(epoch),
			"-var", "blob_sha256=" + sum(blob(epoch)), "-var", "blob_size=" + strconv.Itoa(blobSize)}
		return append(a, extra...)
	}
	env := append(os.Environ(), "HOME="+host)
	var transcript bytes.Buffer
	start := func() (*exec.Cmd, *bytes.Buffer) {
		var out bytes.Buffer
		cmd := exec.Command(agentBin, args("run", "--interval", "1s")...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			fail("start agent run: %v", err)
		}
		running = cmd
		return cmd, &out
	}

	began := time.Now()
	for k := 1; k <= kills; k++ {
		if rng.Intn(3) == 0 {
			epoch++ // this restart brings a new plan
			setEpoch(epoch)
		}
		delay := time.Duration(rng.Int63n(int64(2500 * time.Millisecond)))
		step = fmt.Sprintf("kill %d/%d (epoch %d, after %v)", k, kills, epoch, delay)
		cmd, out := start()
		rc, killed, err := reap(cmd, delay)
		running = nil
		transcript.Write(out.Bytes())
		if err != nil || !killed {
			fail("agent run ended by itself (exit %d, %v) before its kill:\n%s", rc, err, out)
		}
		if err := stateWhole(state); err != nil {
			fail("%v", err)
		}
	}

	step = "converge"
	cmd, out := start()
	defer func() {
		if running != nil {
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			running = nil
		}
	}()
	type resource struct {
		Address string `json:"address"`
		Error   string `json:"error"`
		Status  *struct {
			Healthy bool   `json:"healthy"`
			Summary string `json:"summary"`
			Fields  []struct {
				Name string `json:"name"`
			} `json:"fields"`
		} `json:"status"`
	}
	type statusDoc struct {
		OK        bool       `json:"ok"`
		Resources []resource `json:"resources"`
	}
	var doc statusDoc
	deadline := time.Now().Add(120 * time.Second)
	for {
		resp, err := http.Get("http://" + listen + "/status")
		if err == nil {
			// A fresh document each time: decoding into the last one kept an "error" that
			// the new answer omits (omitempty), so a resource that had waited for its
			// dependency looked as if it still did.
			doc = statusDoc{}
			json.NewDecoder(resp.Body).Decode(&doc)
			resp.Body.Close()
			if doc.OK && len(doc.Resources) == 3 {
				// Converged: every resource reconciled, verified, not down. (Not its
				// health: the server's status runs its smoke test, which a loaded
				// machine may time out now and then; that is not the loop's state.)
				all := true
				for _, r := range doc.Resources {
					if r.Error != "" || r.Status == nil || r.Status.Summary == "not observed yet" {
						all = false
						continue
					}
					for _, f := range r.Status.Fields {
						all = all && f.Name != "down since"
					}
				}
				if all {
					break
				}
			}
		}
		if time.Now().After(deadline) {
			var standing []string
			for _, r := range doc.Resources {
				line := r.Address + ": " + r.Error
				if r.Status != nil {
					line += fmt.Sprintf(" (healthy %v: %s)", r.Status.Healthy, r.Status.Summary)
				}
				standing = append(standing, line)
			}
			fail("agent run did not converge within 2 minutes after %d kills:\n%s\n%s", kills, strings.Join(standing, "\n"), out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// While it runs, a manual apply is refused at once, naming it.
	step = "apply while agent run runs"
	ap := exec.Command(agentBin, args("apply")...)
	ap.Env = env
	apOut, err := ap.CombinedOutput()
	if err == nil || !strings.Contains(string(apOut), fmt.Sprintf("agent run manages this host: \"agent run %s\" (PID %d", planDir, cmd.Process.Pid)) {
		fail("agent apply while agent run runs: %v\n%s", err, apOut)
	}

	step = "final checks"
	cmd.Process.Signal(syscall.SIGTERM)
	if _, killed, err := reap(cmd, 60*time.Second); err != nil || killed {
		fail("agent run did not stop on SIGTERM (%v)", err)
	}
	running = nil
	transcript.Write(out.Bytes())
	if b, err := os.ReadFile(filepath.Join(host, "blobs", "blob.bin")); err != nil || sum(b) != sum(blob(epoch)) {
		fail("the blob is not epoch %d's (%v)", epoch, err)
	}
	var rec struct {
		PID        int    `json:"pid"`
		Generation int    `json:"generation"`
		Marker     string `json:"marker"`
	}
	b, err := os.ReadFile(filepath.Join(state, "resources", "server.qwen.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		fail("server state: %v %q", err, b)
	}
	var alive map[int]string
	until := time.Now().Add(5 * time.Second)
	for {
		alive = map[int]string{}
		for pid, m := range serverProcs(work) {
			if !isZombie(pid) {
				alive[pid] = m
			}
		}
		if len(alive) <= 1 || time.Now().After(until) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(alive) != 1 || alive[rec.PID] == "" || rec.Marker != "" && alive[rec.PID] != rec.Marker {
		fail("want exactly one server process, pid %d (%s), surviving the agent's stop; alive: %v", rec.PID, rec.Marker, alive)
	}
	seenMu.Lock()
	ma, two := maxAlive, twoAlive
	seenMu.Unlock()
	if ma > 1 {
		fail("two server processes alive at once: %s", two)
	}
	launched := map[int]int{}
	for _, m := range regexp.MustCompile(`msg=launched resource=server.qwen generation=(\d+)`).FindAllStringSubmatch(transcript.String(), -1) {
		g, _ := strconv.Atoi(m[1])
		launched[g]++
	}
	for g, n := range launched {
		if n > 1 {
			fail("generation %d launched %d times", g, n)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(host, "logs", "qwen.*.log"))
	for _, p := range logs {
		if n := countStarts(p); n > 1 {
			fail("%s holds %d server starts: a log generation was reused", p, n)
		}
	}
	t.Logf("chaos run: seed %d: %d kills of agent run survived, %d launches (generation %d recorded), %d plan epochs, %v",
		seed, kills, len(launched), rec.Generation, epoch+1, time.Since(began).Round(time.Second))
}
