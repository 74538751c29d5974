package server

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

const homePlan = `
variable "fake" {}
variable "logs" {}
variable "port" { type = number }
variable "home" { default = null }

server "qwen" {
  command = [var.fake]
  flags = {
    "model-path" = "Qwen/Qwen3-8B"
    "port"       = var.port
  }
  home = var.home
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "1s" # not the default 3 s: the test is serial (t.Setenv) and launches often
  }
  stop {
    timeout = "1s"
  }
  log_dir = var.logs
}
`

// TestServerHome (issue 19, point 4): a server gets a writable HOME of its own whoever
// launches it: <state_dir>/home by default (the agent's own HOME is not passed on), and
// a declared home, made when missing, which is part of the identity.
func TestServerHome(t *testing.T) {
	h := newSrvState(t)
	port := srvFreePort(t)
	t.Setenv("HOME", "/nonexistent-agent-home") // the agent's own: never the server's
	engine := func(vars ...string) *agent.Engine {
		vars = append([]string{"fake=" + fakeSGLang(t), "logs=" + filepath.Join(h.dir, "logs"), "port=" + strconv.Itoa(port)}, vars...)
		return restest.Engine(t, h.dir, homePlan, kindsFor(resources.Machine{}), h.store, agent.Options{}, vars...)
	}
	homeOf := func(r serverRecord) string {
		env, err := proc.FS{}.Environ(r.PID)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "HOME="); ok {
				return v
			}
		}
		return ""
	}

	mustOK(t, engine().Apply(context.Background(), nil).Steps[0])
	first := h.record()
	want := filepath.Join(h.dir, "state", "home")
	if got := homeOf(first); got != want {
		t.Fatalf("default HOME = %q, want %q", got, want)
	}
	if fi, err := os.Stat(want); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("default home: %v %v", fi, err)
	}

	// A declared home: a restart naming it, then the server runs with it.
	declared := filepath.Join(h.dir, "srv-home", "qwen")
	step := engine("home=" + declared).Plan(context.Background()).Steps[0]
	if step.Err != nil || step.Diff.Action != agent.Restart ||
		!slices.ContainsFunc(step.Diff.Changes, func(c agent.Change) bool { return c.Attr == "home" && c.New == declared }) {
		t.Fatalf("plan with home: %v %+v", step.Err, step.Diff)
	}
	mustOK(t, engine("home="+declared).Apply(context.Background(), nil).Steps[0])
	second := h.record()
	if second.Generation != 2 || homeOf(second) != declared {
		t.Fatalf("after declaring home: generation %d HOME %q", second.Generation, homeOf(second))
	}
	if fi, err := os.Stat(declared); err != nil || !fi.IsDir() {
		t.Fatalf("declared home not made: %v", err)
	}
	if st := engine("home=" + declared).Plan(context.Background()).Steps[0]; st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after apply: %v %+v", st.Err, st.Diff)
	}

	if _, diags := restest.BindPlan(`server "x" {
  command = ["x"]
  home    = "relative"
}`, kindsFor(resources.Machine{})); !diags.HasErrors() || !strings.Contains(diags.Error(), "Relative home") {
		t.Errorf("relative home accepted: %v", diags)
	}
}
