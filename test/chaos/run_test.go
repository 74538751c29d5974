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
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

func TestChaosRun(t *testing.T) {
	t.Parallel()
	c := newChaos(t, "chaos run", "CHAOS_RUN_KILLS", 15)
	t.Logf("chaos run: seed %d (CHAOS_SEED=%d replays it), %d kills", c.seed, c.seed, c.kills)
	fakeBin := testbin.FakeSGLang(t)
	c.copyPlan(map[string]string{
		filepath.Join(repoRoot(t), "examples/quickstart/quickstart.hcl"): "quickstart.hcl",
		"testdata/download.hcl": "download.hcl",
	})
	port := testbin.FreePort(t)
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))

	srv := &blobServer{content: map[string][]byte{}}
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
	c.watchServers()

	args := func(cmd string, extra ...string) []string {
		mem := []string{"0.85", "0.8"}[epoch%2]
		a := []string{cmd, c.planDir, "--state-dir", c.state, "--log-level", "info",
			"-var", "root=" + c.host, "-var", "fake_sglang=" + fakeBin, "-var", "port=" + strconv.Itoa(port),
			"-var", "mem_fraction=" + mem, "-var", "metrics_listen=" + listen, "-var", "model_url=" + model.URL,
			"-var", "blob_url=" + hs.URL + "/blob/" + strconv.Itoa(epoch),
			"-var", "blob_sha256=" + sum(blob(epoch)), "-var", "blob_size=" + strconv.Itoa(blobSize)}
		return append(a, extra...)
	}
	c.env = append(os.Environ(), "HOME="+c.host)

	began := time.Now()
	c.killRuns(2500*time.Millisecond, func(int) (string, []string) {
		if c.rng.Intn(3) == 0 {
			epoch++ // this restart brings a new plan
			setEpoch(epoch)
		}
		return fmt.Sprintf("epoch %d, ", epoch), args("run", "--interval", "1s")
	})

	c.step = "converge"
	cmd, out := c.start(args("run", "--interval", "1s")...)
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
	waitStatus(c, listen, 120*time.Second, func(doc *statusDoc) bool {
		if !doc.OK || len(doc.Resources) != 3 {
			return false
		}
		// Converged: every resource reconciled, verified, not down. (Not its health:
		// the server's status runs its smoke test, which a loaded machine may time out
		// now and then; that is not the loop's state.)
		for _, r := range doc.Resources {
			if r.Error != "" || r.Status == nil || r.Status.Summary == "not observed yet" {
				return false
			}
			for _, f := range r.Status.Fields {
				if f.Name == "down since" {
					return false
				}
			}
		}
		return true
	}, func(doc *statusDoc) string {
		var standing []string
		for _, r := range doc.Resources {
			line := r.Address + ": " + r.Error
			if r.Status != nil {
				line += fmt.Sprintf(" (healthy %v: %s)", r.Status.Healthy, r.Status.Summary)
			}
			standing = append(standing, line)
		}
		return fmt.Sprintf("agent run did not converge within 2 minutes after %d kills:\n%s\n%s", c.kills, strings.Join(standing, "\n"), out)
	})

	// While it runs, a manual apply is refused at once, naming it.
	c.step = "apply while agent run runs"
	ap := exec.Command(c.agentBin, args("apply")...)
	ap.Env = c.env
	apOut, err := ap.CombinedOutput()
	if err == nil || !strings.Contains(string(apOut), fmt.Sprintf("agent run manages this host: \"agent run %s\" (PID %d", c.planDir, cmd.Process.Pid)) {
		c.fail("agent apply while agent run runs: %v\n%s", err, apOut)
	}

	c.step = "final checks"
	c.stop(cmd, out)
	if b, err := os.ReadFile(filepath.Join(c.host, "blobs", "blob.bin")); err != nil || sum(b) != sum(blob(epoch)) {
		c.fail("the blob is not epoch %d's (%v)", epoch, err)
	}
	rec, _ := c.checkOneServer(5 * time.Second) // the one that survives the agent's stop
	launched := c.launches()
	c.checkOneLaunchEach(launched)
	t.Logf("chaos run: seed %d: %d kills of agent run survived, %d launches (generation %d recorded), %d plan epochs, %v",
		c.seed, c.kills, len(launched), rec.Generation, epoch+1, time.Since(began).Round(time.Second))
}
