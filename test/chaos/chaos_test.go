package chaos_test

// TestChaos: crash anywhere (issue 9, point 1). The quickstart plan (examples/quickstart)
// plus a download from a throttled loopback HTTP server is applied again and again while
// the agent is SIGKILLed at random points; after every converged apply the plan changes
// (a new blob, a new --mem-fraction-static) so the kills land in downloads, verified stops
// and launches, not only in no-op plans. Afterwards the next apply converges and a plan is
// a no-op, and:
//
//   - no file is in place unverified: every managed file holds exactly a content the plan
//     declared at some point (never a prefix, never a mix);
//   - no resumable partial is lost: after a kill that left a checkpoint at offset O, the
//     next request for that file starts at O or later;
//   - no server was started twice: a sampler reading /proc/*/environ (by PID and environ
//     only) never saw two processes of this run's server alive at once, and at the end
//     exactly one is, the one the state records;
//   - one log generation per launch: each <name>.<gen>.log holds at most one server start,
//     and every launch the agent logged has its own generation;
//   - state is never half-written: every *.json under the state dir parses after every kill;
//   - the lock is never stuck: every apply after a kill takes it with --lock-timeout 0, and
//     so does the final plan.
//
// CHAOS_KILLS (default 50) sets the number of kills, CHAOS_SEED replays a run; any failure
// prints the seed and the step.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
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

const (
	blobSize   = 3 << 20 // bytes per blob
	blobChunk  = 32 << 10
	blobPause  = 10 * time.Millisecond // ≈ 3 MiB/s: a blob takes about a second
	maxDelay   = 1600 * time.Millisecond
	applyLimit = 90 * time.Second // one apply that is not killed
)

// blob is epoch e's download content: deterministic, different per epoch.
func blob(e int) []byte {
	b := make([]byte, blobSize)
	seed := sha256.Sum256([]byte("chaos blob " + strconv.Itoa(e)))
	for i := 0; i < len(b); i += len(seed) {
		seed = sha256.Sum256(seed[:])
		copy(b[i:], seed[:])
	}
	return b
}

func sum(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

// blobServer serves /blob/E slowly with ranges and ETags, and checks resumption: when
// expect[path] is set, the next GET of path must start at that offset or later.
type blobServer struct {
	mu         sync.Mutex
	content    map[string][]byte
	expect     map[string]int64
	violations []string
	gets       int
	resumes    int // GETs checked against a checkpoint left by a kill
	sent       int64
}

func (s *blobServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	body, ok := s.content[r.URL.Path]
	if ok && r.Method == http.MethodGet {
		s.gets++
		start := int64(0)
		if m := regexp.MustCompile(`^bytes=(\d+)-`).FindStringSubmatch(r.Header.Get("Range")); m != nil {
			start, _ = strconv.ParseInt(m[1], 10, 64)
		}
		if want, has := s.expect[r.URL.Path]; has {
			delete(s.expect, r.URL.Path)
			s.resumes++
			if start < want {
				s.violations = append(s.violations, fmt.Sprintf("%s: resumed at %d, but a checkpoint at %d was left", r.URL.Path, start, want))
			}
		}
	}
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("ETag", `"`+sum(body)[:16]+`"`)
	http.ServeContent(&slowWriter{ResponseWriter: w, s: s}, r, "", time.Unix(1700000000, 0), bytes.NewReader(body))
}

type slowWriter struct {
	http.ResponseWriter
	s *blobServer
}

func (w *slowWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), blobChunk)
		m, err := w.ResponseWriter.Write(p[:c])
		n += m
		w.s.mu.Lock()
		w.s.sent += int64(m)
		w.s.mu.Unlock()
		if err != nil {
			return n, err
		}
		p = p[c:]
		time.Sleep(blobPause)
	}
	return n, nil
}

// quickstartModel is what the quickstart's download puts under host: its model
// directory (examples/quickstart/model) and the placeholder weights, path → content.
func quickstartModel(t *testing.T, root, host string) map[string]string {
	t.Helper()
	out := map[string]string{filepath.Join(host, "models/Qwen3.6-27B/model.safetensors"): string(make([]byte, testbin.QuickstartWeightsSize))}
	for _, name := range []string{"config.json", "tokenizer.json"} {
		b, err := os.ReadFile(filepath.Join(root, "examples/quickstart/model", name))
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.Join(host, "models/Qwen3.6-27B", name)] = string(b)
	}
	return out
}

func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
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

func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: not in -short")
	}
	kills, seed := chaosParams(t)
	t.Logf("chaos: seed %d (CHAOS_SEED=%d replays it), %d kills", seed, seed, kills)
	rng := rand.New(rand.NewSource(seed))
	step := "setup"
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("chaos seed %d, step %s: %s\nreplay: CHAOS_SEED=%d CHAOS_KILLS=%d go test ./test/chaos -run TestChaos -v",
			seed, step, fmt.Sprintf(format, args...), seed, kills)
	}

	root := repoRoot(t)
	work := t.TempDir()
	testbin.NoLeaks(t, work)
	agentBin, fakeBin := testbin.Agent(t), testbin.FakeSGLang(t)

	// The plan: the quickstart as it is, plus the chaos download.
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
	host := filepath.Join(work, "host") // var.root: unique to this run
	state := filepath.Join(work, "state")
	must(t, os.MkdirAll(host, 0o755))
	port := testbin.FreePort(t)

	srv := &blobServer{content: map[string][]byte{}, expect: map[string]int64{}}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	model := testbin.QuickstartModel(t) // the quickstart's model directory
	blobs := map[string]int{}           // sha256 → epoch, for the in-place check
	setEpoch := func(e int) {
		b := blob(e)
		srv.mu.Lock()
		srv.content["/blob/"+strconv.Itoa(e)] = b
		srv.mu.Unlock()
		blobs[sum(b)] = e
	}

	// Every process this run's agent started as the server, seen by the sampler; cleanup
	// kills what is left of them (their process groups: the agent starts each with setsid).
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
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
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
		sample()
		seenMu.Lock()
		defer seenMu.Unlock()
		for pid := range seen {
			if m, ok := serverProcs(work)[pid]; ok && m == seen[pid] {
				syscall.Kill(-pid, syscall.SIGKILL) // its group (setsid: pgid = pid)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})

	epoch := 0
	setEpoch(epoch)
	args := func(cmd string, extra ...string) []string {
		mem := []string{"0.85", "0.8"}[epoch%2]
		a := []string{cmd, planDir, "--state-dir", state, "--log-level", "info",
			"-var", "root=" + host, "-var", "fake_sglang=" + fakeBin, "-var", "port=" + strconv.Itoa(port),
			"-var", "mem_fraction=" + mem, "-var", "model_url=" + model.URL,
			"-var", "blob_url=" + hs.URL + "/blob/" + strconv.Itoa(epoch),
			"-var", "blob_sha256=" + sum(blob(epoch)), "-var", "blob_size=" + strconv.Itoa(blobSize)}
		return append(a, extra...)
	}
	env := append(os.Environ(), "HOME="+host)
	var transcript bytes.Buffer // every agent's output, for the launch accounting
	start := func(cmdName string, extra ...string) (*exec.Cmd, *bytes.Buffer) {
		var out bytes.Buffer
		cmd := exec.Command(agentBin, args(cmdName, extra...)...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			fail("start agent: %v", err)
		}
		running = cmd
		return cmd, &out
	}
	// wait reaps cmd, killing it (by PID, the agent alone) after limit; it returns the
	// exit code and whether the kill came first.
	wait := func(cmd *exec.Cmd, out *bytes.Buffer, limit time.Duration) (rc int, killed bool) {
		rc, killed, err := reap(cmd, limit)
		running = nil
		transcript.Write(out.Bytes())
		if err != nil {
			fail("agent: %v", err)
		}
		return rc, killed
	}

	logDir := filepath.Join(host, "logs")
	blobPath := filepath.Join(host, "blobs", "blob.bin")
	declared := quickstartModel(t, root, host) // the quickstart's downloaded files: path → content
	// checkHost is what must hold after every kill.
	checkHost := func() {
		t.Helper()
		if err := stateWhole(state); err != nil {
			fail("%v", err)
		}
		for p, want := range declared {
			if b, err := os.ReadFile(p); err == nil && string(b) != want {
				fail("%s is in place with %d bytes that differ from the only content the plan declared", p, len(b))
			}
		}
		if b, err := os.ReadFile(blobPath); err == nil {
			if _, ok := blobs[sum(b)]; !ok {
				fail("%s is in place unverified: %d bytes matching no blob served", blobPath, len(b))
			}
		}
		// A checkpoint left behind must be resumed from, not thrown away.
		side := filepath.Join(host, "blobs", ".blob.bin.partial.json")
		if b, err := os.ReadFile(side); err == nil {
			var sc struct {
				URL    string `json:"url"`
				Offset int64  `json:"offset"`
			}
			if json.Unmarshal(b, &sc) == nil && sc.Offset > 0 && strings.HasPrefix(sc.URL, hs.URL) {
				srv.mu.Lock()
				srv.expect[strings.TrimPrefix(sc.URL, hs.URL)] = sc.Offset
				srv.mu.Unlock()
			}
		}
	}

	began := time.Now()
	killed, converged, runs := 0, 0, 0
	for killed < kills {
		runs++
		delay := time.Duration(rng.Int63n(int64(maxDelay)))
		step = fmt.Sprintf("run %d (kill %d/%d, epoch %d, kill after %v)", runs, killed+1, kills, epoch, delay)
		cmd, out := start("apply")
		rc, wasKilled := wait(cmd, out, delay)
		if wasKilled {
			killed++
			checkHost()
			continue
		}
		if rc != 0 {
			fail("apply exited %d without being killed:\n%s", rc, out)
		}
		converged++
		checkHost()
		epoch++ // change the plan: a new blob and a new flag
		setEpoch(epoch)
	}

	step = "final apply"
	cmd, out := start("apply")
	if rc, _ := wait(cmd, out, applyLimit); rc != 0 {
		fail("the apply after %d kills exited %d:\n%s", killed, rc, out)
	}
	checkHost()
	step = "final plan"
	cmd, out = start("plan", "--lock-timeout", "0")
	if rc, _ := wait(cmd, out, applyLimit); rc != 0 || !strings.Contains(out.String(), "No changes.") {
		fail("plan after the converging apply exited %d (want 0, no changes; the lock must be free):\n%s", rc, out)
	}

	step = "final checks"
	// Files: all in place, verified.
	for p, want := range declared {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			fail("%s: %d bytes, %v; want the declared content (%d bytes)", p, len(b), err, len(want))
		}
	}
	if b, err := os.ReadFile(blobPath); err != nil || sum(b) != sum(blob(epoch)) {
		fail("%s is not epoch %d's blob (%v)", blobPath, epoch, err)
	}
	srv.mu.Lock()
	violations, gets, sent, resumes := srv.violations, srv.gets, srv.sent, srv.resumes
	srv.mu.Unlock()
	if len(violations) > 0 {
		fail("partial downloads lost:\n%s", strings.Join(violations, "\n"))
	}
	// Servers: exactly one alive, the recorded one; never two at once.
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
	deadline := time.Now().Add(5 * time.Second) // zombies of killed agents are reaped by init
	for {
		alive = map[int]string{}
		for pid, m := range serverProcs(work) {
			if !isZombie(pid) {
				alive[pid] = m
			}
		}
		if len(alive) <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The recorded marker is the live one's; an adopted process (a launch whose record a
	// kill prevented, found again by its exact argv) has none recorded.
	if len(alive) != 1 || alive[rec.PID] == "" || rec.Marker != "" && alive[rec.PID] != rec.Marker {
		fail("want exactly one server process, pid %d (%s); alive: %v", rec.PID, rec.Marker, alive)
	}
	seenMu.Lock()
	ma, two := maxAlive, twoAlive
	seenMu.Unlock()
	if ma > 1 {
		fail("two server processes alive at once: %s", two)
	}
	// Logs: one generation per launch.
	launched := map[int]int{} // generation → launches logged by the agents
	for _, m := range regexp.MustCompile(`msg=launched resource=server.qwen generation=(\d+)`).FindAllStringSubmatch(transcript.String(), -1) {
		g, _ := strconv.Atoi(m[1])
		launched[g]++
	}
	if len(launched) == 0 {
		fail("no launch logged (is --log-level info still logging msg=launched?)")
	}
	logs, _ := filepath.Glob(filepath.Join(logDir, "qwen.*.log"))
	for _, p := range logs {
		g, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "qwen."), ".log"))
		if err != nil {
			continue
		}
		n := countStarts(p)
		if n > 1 {
			fail("%s holds %d server starts: a log generation was reused", p, n)
		}
		if n == 1 && launched[g] == 0 {
			// Killed between the process start and the agent's log line: the launch
			// is real (its record came from OnStarted or adoption), only unlogged.
			t.Logf("%s: a server start the agents did not log (killed right after the launch)", p)
		}
	}
	for g, n := range launched {
		if n > 1 {
			fail("generation %d launched %d times", g, n)
		}
	}
	if rec.Generation < len(launched) {
		fail("state records generation %d after %d launches", rec.Generation, len(launched))
	}
	t.Logf("chaos: seed %d: %d kills survived, %d applies converged, %d launches (generations 1..%d), %d blob epochs, %d GETs (%d resumed from a checkpoint), %d bytes served (%.1f× the blobs), %v",
		seed, killed, converged, len(launched), rec.Generation, epoch+1, gets, resumes, sent, float64(sent)/float64((epoch+1)*blobSize), time.Since(began).Round(time.Second))
	fmt.Printf("CHAOS kills=%d converged=%d launches=%d resumes=%d seed=%d\n", killed, converged, len(launched), resumes, seed)
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

// chaosParams reads CHAOS_KILLS (default 50) and CHAOS_SEED (default: the clock).
func chaosParams(t *testing.T) (kills int, seed int64) {
	t.Helper()
	kills = 50
	if v := os.Getenv("CHAOS_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CHAOS_KILLS=%q: want a positive number", v)
		}
		kills = n
	}
	seed = time.Now().UnixNano()
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	return kills, seed
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

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
