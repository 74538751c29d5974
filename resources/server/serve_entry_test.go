package server

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// serveEntryPlan launches through SGLang's recommended entry point, `sglang serve MODEL
// --flags` (the fake's `serve` form), with a flag that may carry a typo.
const serveEntryPlan = `
variable "fake" {}
variable "logs" {}
variable "port" { type = number }
variable "level_flag" { default = "log-requests-level" }

server "qwen" {
  command = [var.fake, "serve", "Qwen/Qwen3-8B"]
  flags = {
    "port"         = var.port
    "log-requests" = true
    (var.level_flag) = 2
  }
  env  = { FAKE_SGLANG_DECODE_INTERVAL = "100ms" }
  port = var.port
  ready {
    http     = "/health"
    log_line = "The server is fired up and ready to roll!"
    timeout  = "15s"
  }
  stop {
    timeout = "1s"
  }
  log_dir = var.logs
  revert  = false # the failed launch stays reported (server_revert_test.go rolls back)
}
`

// The `sglang serve` entry point launches, is left alone when it matches, and a typo in
// a flag is the launch's named failure: "sglang serve: error: unrecognized arguments"
// (a space in the program name) is a bad command line, not a silent death.
func TestServerServeEntryPoint(t *testing.T) {
	t.Parallel()
	h := newSrvState(t)
	port := srvFreePort(t)
	logs := filepath.Join(h.dir, "logs")
	run := func(op string, vars ...string) *agent.Step {
		t.Helper()
		vars = append([]string{"fake=" + fakeSGLang(t), "logs=" + logs, "port=" + strconv.Itoa(port)}, vars...)
		e := restest.Engine(t, h.dir, serveEntryPlan, kindsFor(resources.Machine{}), h.store, agent.Options{}, vars...)
		switch op {
		case "plan":
			return e.Plan(context.Background()).Steps[0]
		case "status":
			return e.Status(context.Background()).Steps[0]
		}
		return e.Apply(context.Background(), nil).Steps[0]
	}
	mustOK(t, run("apply"))
	first := h.record()
	if got := strings.Join(first.Argv[1:], " "); !strings.HasPrefix(got, "serve Qwen/Qwen3-8B --log-requests --log-requests-level 2 --port ") {
		t.Errorf("argv = %q", first.Argv)
	}
	if st := run("plan"); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after apply: %v %+v", st.Err, st.Diff)
	}
	st := run("apply", "level_flag=log-requests-levle")
	if st.Err == nil {
		t.Fatal("a launch with a misspelt flag applied without error")
	}
	for _, want := range []string{"launch of generation 2 failed", "bad command line", "sglang serve: error: unrecognized arguments: --log-requests-levle 2"} {
		if !strings.Contains(st.Err.Error(), want) {
			t.Errorf("apply error lacks %q:\n%s", want, st.Err)
		}
	}
	s := run("status", "level_flag=log-requests-levle")
	mustOK(t, s)
	if s.Status.Healthy || !strings.Contains(s.Status.Summary, "bad command line") {
		t.Errorf("status = %+v", s.Status)
	}
}
