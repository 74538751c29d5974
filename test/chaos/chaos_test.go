package chaos_test

// TestChaos: crash anywhere (issue 9, point 1). The quickstart plan (examples/quickstart)
// plus a download from a throttled loopback HTTP server is applied again and again while
// the agent is SIGKILLed at random points (after four kills in a row one apply runs to its
// end); after every converged apply the plan changes (a new blob, a new
// --mem-fraction-static) so the kills land in downloads, verified stops and launches, not
// only in no-op plans. Afterwards the next apply converges and a plan is a no-op, and:
//
//   - no file is in place unverified: every managed file holds exactly a content the plan
//     declared at some point (never a prefix, never a mix);
//   - no resumable partial is lost: no request asks again for bytes that a kill's
//     checkpoint held (a ranged download's durable bytes per block, or a single
//     stream's prefix);
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
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
	// killStreak is how many applies in a row are killed before one runs to its end. A
	// converging apply takes longer than maxDelay (its smoke test alone takes seconds on
	// 2 cores), so without it no apply converged, the plan never changed, and every kill
	// after the first deployment landed in the verification of the same server: none in
	// a download of a new blob (no checkpoint was ever resumed), a verified stop or a
	// launch of a new generation.
	killStreak = 4
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

// blobServer serves /blob/E slowly with ranges and ETags, and checks resumption: no GET
// of path may ask again for bytes in durable[path], what a killed agent's checkpoint
// said it had on disk (a ranged download's sidecar, version 2, counts durable bytes per
// block; a single stream's, version 1, a prefix).
type blobServer struct {
	mu         sync.Mutex
	content    map[string][]byte
	durable    map[string][][2]int64 // path → [from, to) byte ranges
	checked    map[string]bool       // the next GET of path is the first since its checkpoint was read
	violations []string
	gets       int
	resumes    int // GETs checked against a checkpoint left by a kill, the first after each
	sent       int64
}

var rangeHeader = regexp.MustCompile(`^bytes=(\d+)-(\d*)$`)

func (s *blobServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	body, ok := s.content[r.URL.Path]
	if ok && r.Method == http.MethodGet {
		s.gets++
		start, end := int64(0), int64(len(body)-1)
		if m := rangeHeader.FindStringSubmatch(r.Header.Get("Range")); m != nil {
			start, _ = strconv.ParseInt(m[1], 10, 64)
			if m[2] != "" {
				end, _ = strconv.ParseInt(m[2], 10, 64)
			}
		}
		// bytes=0-0 is the single stream's probe for the size and the ETag (grab's HEAD),
		// not a download.
		if ranges := s.durable[r.URL.Path]; len(ranges) > 0 && (start != 0 || end != 0) {
			if s.checked[r.URL.Path] {
				s.resumes++
				s.checked[r.URL.Path] = false
			}
			again := int64(0)
			for _, d := range ranges {
				if start < d[1] && end >= d[0] {
					again += min(end+1, d[1]) - max(start, d[0])
				}
			}
			if again > 0 {
				s.violations = append(s.violations, fmt.Sprintf("%s: GET bytes=%d-%d asks again for %d bytes that a checkpoint left by a kill holds",
					r.URL.Path, start, end, again))
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

func TestChaos(t *testing.T) {
	t.Parallel()
	c := newChaos(t, "chaos", "CHAOS_KILLS", 50)
	t.Logf("chaos: seed %d (CHAOS_SEED=%d replays it), %d kills", c.seed, c.seed, c.kills)
	root := repoRoot(t)
	fakeBin := testbin.FakeSGLang(t)

	// The plan: the quickstart as it is, plus the chaos download.
	c.copyPlan(map[string]string{
		filepath.Join(root, "examples/quickstart/quickstart.hcl"): "quickstart.hcl",
		"testdata/download.hcl":                                   "download.hcl",
	})
	host, state := c.host, c.state // var.root: unique to this run
	port := testbin.FreePort(t)

	srv := &blobServer{content: map[string][]byte{}, durable: map[string][][2]int64{}, checked: map[string]bool{}}
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
	// Every process this run's agent starts as the server is sampled; cleanup kills what
	// is left of them (their process groups: the agent starts each with setsid).
	c.watchServers()

	epoch := 0
	setEpoch(epoch)
	args := func(cmd string, extra ...string) []string {
		mem := []string{"0.85", "0.8"}[epoch%2]
		a := []string{cmd, c.planDir, "--state-dir", state, "--log-level", "info",
			"-var", "root=" + host, "-var", "fake_sglang=" + fakeBin, "-var", "port=" + strconv.Itoa(port),
			"-var", "mem_fraction=" + mem, "-var", "model_url=" + model.URL,
			"-var", "blob_url=" + hs.URL + "/blob/" + strconv.Itoa(epoch),
			"-var", "blob_sha256=" + sum(blob(epoch)), "-var", "blob_size=" + strconv.Itoa(blobSize)}
		return append(a, extra...)
	}
	c.env = append(os.Environ(), "HOME="+host)
	// run starts the agent and reaps it, killing it (by PID, the agent alone) after
	// limit; it returns the exit code and whether the kill came first.
	run := func(limit time.Duration, cmd string, extra ...string) (int, bool, *bytes.Buffer) {
		p, out := c.start(args(cmd, extra...)...)
		rc, killed := c.reap(p, out, limit)
		return rc, killed, out
	}

	logDir := filepath.Join(host, "logs")
	blobPath := filepath.Join(host, "blobs", "blob.bin")
	declared := quickstartModel(t, root, host) // the quickstart's downloaded files: path → content
	// checkHost is what must hold after every kill.
	checkHost := func() {
		t.Helper()
		if err := stateWhole(state); err != nil {
			c.fail("%v", err)
		}
		for p, want := range declared {
			if b, err := os.ReadFile(p); err == nil && string(b) != want {
				c.fail("%s is in place with %d bytes that differ from the only content the plan declared", p, len(b))
			}
		}
		if b, err := os.ReadFile(blobPath); err == nil {
			if _, ok := blobs[sum(b)]; !ok {
				c.fail("%s is in place unverified: %d bytes matching no blob served", blobPath, len(b))
			}
		}
		// A checkpoint left behind must be resumed from, not thrown away.
		side := filepath.Join(host, "blobs", ".blob.bin.partial.json")
		if b, err := os.ReadFile(side); err == nil {
			var sc struct {
				Version int     `json:"version"`
				URL     string  `json:"url"`
				Offset  int64   `json:"offset"` // version 1: the durable prefix
				Piece   int64   `json:"piece"`  // version 2: the block Done counts
				Done    []int64 `json:"done"`   // durable bytes of each block, from its start
			}
			if json.Unmarshal(b, &sc) == nil && strings.HasPrefix(sc.URL, hs.URL) {
				var ranges [][2]int64
				if sc.Offset > 0 {
					ranges = append(ranges, [2]int64{0, sc.Offset})
				}
				for i, n := range sc.Done {
					if n > 0 {
						ranges = append(ranges, [2]int64{int64(i) * sc.Piece, int64(i)*sc.Piece + n})
					}
				}
				if len(ranges) > 0 {
					path := strings.TrimPrefix(sc.URL, hs.URL)
					srv.mu.Lock()
					srv.durable[path], srv.checked[path] = ranges, true
					srv.mu.Unlock()
				}
			}
		}
	}

	began := time.Now()
	killed, converged, runs, streak := 0, 0, 0, 0
	for killed < c.kills {
		runs++
		delay := time.Duration(c.rng.Int63n(int64(maxDelay)))
		c.step = fmt.Sprintf("run %d (kill %d/%d, epoch %d, kill after %v)", runs, killed+1, c.kills, epoch, delay)
		if streak == killStreak {
			delay = applyLimit
			c.step = fmt.Sprintf("run %d (epoch %d, not killed after %d kills in a row)", runs, epoch, streak)
		}
		rc, wasKilled, out := run(delay, "apply")
		if wasKilled {
			killed++
			streak++
			checkHost()
			continue
		}
		streak = 0
		if rc != 0 {
			c.fail("apply exited %d without being killed:\n%s", rc, out)
		}
		converged++
		checkHost()
		epoch++ // change the plan: a new blob and a new flag
		setEpoch(epoch)
	}

	c.step = "final apply"
	if rc, _, out := run(applyLimit, "apply"); rc != 0 {
		c.fail("the apply after %d kills exited %d:\n%s", killed, rc, out)
	}
	checkHost()
	c.step = "final plan"
	if rc, _, out := run(applyLimit, "plan", "--lock-timeout", "0"); rc != 0 || !strings.Contains(out.String(), "No changes.") {
		c.fail("plan after the converging apply exited %d (want 0, no changes; the lock must be free):\n%s", rc, out)
	}

	c.step = "final checks"
	// Files: all in place, verified.
	for p, want := range declared {
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			c.fail("%s: %d bytes, %v; want the declared content (%d bytes)", p, len(b), err, len(want))
		}
	}
	if b, err := os.ReadFile(blobPath); err != nil || sum(b) != sum(blob(epoch)) {
		c.fail("%s is not epoch %d's blob (%v)", blobPath, epoch, err)
	}
	srv.mu.Lock()
	violations, gets, sent, resumes := srv.violations, srv.gets, srv.sent, srv.resumes
	srv.mu.Unlock()
	if len(violations) > 0 {
		c.fail("partial downloads lost:\n%s", strings.Join(violations, "\n"))
	}
	// Servers: exactly one alive, the recorded one; never two at once.
	rec, _ := c.checkOneServer(5 * time.Second)
	// Logs: one generation per launch.
	launched := c.launches() // generation → launches logged by the agents
	if len(launched) == 0 {
		c.fail("no launch logged (is --log-level info still logging msg=launched?)")
	}
	logs, _ := filepath.Glob(filepath.Join(logDir, "qwen.*.log"))
	for _, p := range logs {
		g, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "qwen."), ".log"))
		if err != nil {
			continue
		}
		if countStarts(p) == 1 && launched[g] == 0 {
			// Killed between the process start and the agent's log line: the launch
			// is real (its record came from OnStarted or adoption), only unlogged.
			t.Logf("%s: a server start the agents did not log (killed right after the launch)", p)
		}
	}
	c.checkOneLaunchEach(launched)
	if rec.Generation < len(launched) {
		c.fail("state records generation %d after %d launches", rec.Generation, len(launched))
	}
	t.Logf("chaos: seed %d: %d kills survived, %d applies converged, %d launches (generations 1..%d), %d blob epochs, %d GETs (%d resumed from a checkpoint), %d bytes served (%.1f× the blobs), %v",
		c.seed, killed, converged, len(launched), rec.Generation, epoch+1, gets, resumes, sent, float64(sent)/float64((epoch+1)*blobSize), time.Since(began).Round(time.Second))
	fmt.Printf("CHAOS kills=%d converged=%d launches=%d resumes=%d seed=%d\n", killed, converged, len(launched), resumes, c.seed)
}
