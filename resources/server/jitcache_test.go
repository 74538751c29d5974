package server

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

const jitPlan = `
variable "fake" {}
variable "logs" {}
variable "port" { type = number }
variable "mem" {}

server "qwen" {
  command = [var.fake]
  flags = {
    "model-path"          = "Qwen/Qwen3-8B"
    "port"                = var.port
    "mem-fraction-static" = var.mem
  }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "1s" # not the default 3 s: the test is not about it
  }
  stop {
    timeout = "1s"
  }
  log_dir = var.logs
}
`

// TestServerJITCachesSurviveARelaunch (issue 26, point 4): the JIT caches of a server
// live under its home in the state directory, never under /tmp, and the next
// generation finds what the previous one compiled. The cache locations are not part of
// the identity: the agent's default adds no change to a running server's plan.
func TestServerJITCachesSurviveARelaunch(t *testing.T) {
	t.Parallel()
	h := newSrvState(t)
	port := srvFreePort(t)
	logs := filepath.Join(h.dir, "logs")
	engine := func(mem string) *agent.Engine {
		vars := []string{"fake=" + fakeSGLang(t), "logs=" + logs, "port=" + strconv.Itoa(port), "mem=" + mem}
		return restest.Engine(t, h.dir, jitPlan, kindsFor(resources.Machine{}), h.store, agent.Options{}, vars...)
	}
	mustOK(t, engine("0.8").Apply(context.Background(), nil).Steps[0])
	home := filepath.Join(h.dir, "state", "home")
	for _, dir := range []string{".cache/torchinductor", ".cache/triton"} {
		if _, err := os.Stat(filepath.Join(home, dir, "fake-kernel.bin")); err != nil {
			t.Errorf("generation 1 compiled nothing into %s: %v", dir, err)
		}
	}
	if st := engine("0.8").Plan(context.Background()).Steps[0]; st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after apply: %v %+v", st.Err, st.Diff)
	}

	mustOK(t, engine("0.85").Apply(context.Background(), nil).Steps[0])
	rec := h.record()
	if rec.Generation != 2 {
		t.Fatalf("generation %d after a flag change, want 2", rec.Generation)
	}
	b, err := os.ReadFile(filepath.Join(logs, "qwen.2.log"))
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	for _, dir := range []string{".cache/torchinductor", ".cache/triton"} {
		if !strings.Contains(log, "JIT cache reused: "+filepath.Join(home, dir, "fake-kernel.bin")) {
			t.Errorf("generation 2 did not find generation 1's cache in %s:\n%s", dir, log)
		}
	}
	if strings.Contains(log, "under /tmp") {
		t.Errorf("generation 2 compiled under /tmp:\n%s", log)
	}
}
