package daemon

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// Issue 26, point 3: under agent run, a verified launch's start phases are in /metrics as
// agent_server_start_phase_seconds{resource, kind, phase} (the fake loads its "weights"
// for 2 s), and in /status as the status's series.
func TestStartPhasesInMetrics(t *testing.T) {
	t.Parallel()
	fake, root := fakeRoot(t)
	base, _ := runReal(t, serverPlan, []string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t)), "faults=slow-start=2s", "settle=200ms"}, nil)
	ready := regexp.MustCompile(`(?m)^agent_server_start_phase_seconds\{kind="server",name="qwen",phase="ready",resource="server.qwen"\} [0-9.e+-]+$`)
	weights := regexp.MustCompile(`(?m)^agent_server_start_phase_seconds\{kind="server",name="qwen",phase="weights_loaded",resource="server.qwen"\} ([0-9.e+-]+)$`)
	var body []byte
	waitLong(t, "the start phases in /metrics", 60*time.Second, func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %s\n%s", resp.Status, body)
		}
		return ready.Match(body)
	})
	m := weights.FindSubmatch(body)
	if m == nil {
		t.Fatalf("no weights_loaded phase in /metrics:\n%s", body)
	}
	if v, _ := strconv.ParseFloat(string(m[1]), 64); v < 1 || v > 10 {
		t.Errorf("weights_loaded took %v s, want about the fake's 2 s", v)
	}
	phases := map[string]bool{}
	for _, s := range statusOf(t, base, "server.qwen").Status.Series {
		if s.Name == "start_phase_seconds" {
			phases[s.Labels["phase"]] = true
		}
	}
	if !phases["ready"] || !phases["weights_loaded"] {
		t.Errorf("/status series has phases %v, want ready and weights_loaded", phases)
	}
}
