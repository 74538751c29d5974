package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/docs/schema"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/internal/view"
)

// jsonPlan has a file and a server (the fake SGLang): typed changes, a status with typed
// fields, a relaunch's process, and a daemon's status.
const jsonPlan = `variable "root" {}
variable "fake" {}
variable "port" { type = number }
variable "listen" {}

agent {
  metrics_listen = var.listen
}

variable "token" {
  default   = "hf_planted_secret"
  sensitive = true
}

file "motd" {
  path    = "${var.root}/motd"
  content = "hi\n"
  mode    = "0644"
}

file "token" {
  path    = "${var.root}/hf-token"
  content = var.token
  mode    = "0600"
}

server "qwen" {
  command = [var.fake]
  flags = {
    "model-path"          = "Qwen/Qwen3-8B"
    "port"                = var.port
    "mem-fraction-static" = 0.8
  }
  env = { FAKE_SGLANG = "crash-after=2m", FAKE_SGLANG_DECODE_INTERVAL = "1h", HF_TOKEN = var.token }
  ready {
    http     = "/health"
    log_line = "The server is fired up and ready to roll!"
    timeout  = "15s"
  }
  stop {
    timeout = "2s"
  }
  log_dir    = "${var.root}/logs"
  depends_on = [file.motd]
}
`

// jsonBad has two errors: diagnostics, every one at once.
const jsonBad = `file "a" {
  path    = "/etc/a"
  content = "a"
  colour  = "red"
}

server "b" {
  command = "not a list"
}
`

// jsonFail has a file that cannot be written (its directory is a file) and one that
// depends on it: a failed step and a skipped one.
const jsonFail = `variable "root" {}
file "blocked" {
  path    = "${var.root}/motd/inside"
  content = "x"
}
file "after" {
  path       = "${var.root}/after"
  content    = "y"
  depends_on = [file.blocked]
}
`

// jsonHost is guarded for another host.
const jsonHost = `variable "root" {}
host {
  hostname = "not-this-host.invalid"
}
file "motd" {
  path    = "${var.root}/motd"
  content = "hi\n"
}
`

// Every command's --json document, printed by the real binary, is valid against the
// shipped schema (docs/schema/output-v3.json) and equal, normalized, to its golden file
// in testdata/json (go test ./internal/cli -run TestJSONOutput -update rewrites them):
// validate (valid and not), plan, apply, status (observed here, and answered by a
// running `agent run`, whose /status is checked too), destroy, a saved plan's show, and
// the error documents of an invalid plan, a lock held by another agent, a lock held by
// `agent run`, a plan guarded for another host and a saved plan the host no longer matches. The planted secret appears in none of them.
func TestJSONOutput(t *testing.T) {
	t.Parallel()
	bin := testbin.Agent(t)
	dir := t.TempDir()
	testbin.NoLeaks(t, dir)
	t.Cleanup(func() { testbin.KillServers(dir) })
	stateDir := filepath.Join(dir, "state")
	port, listen := testbin.FreePort(t), "127.0.0.1:"+strconv.Itoa(testbin.FreePort(t))
	for name, src := range map[string]string{"plan.hcl": jsonPlan, "bad.hcl": jsonBad, "host.hcl": jsonHost, "fail.hcl": jsonFail} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	vars := map[string]string{"WORK": dir, "FAKE_SGLANG_BIN": testbin.FakeSGLang(t), "PORT": strconv.Itoa(port),
		"PORT2": strings.TrimPrefix(listen, "127.0.0.1:")}
	env := append(os.Environ(), "AGENT_VAR_root="+filepath.Join(dir, "root"), "AGENT_VAR_fake="+vars["FAKE_SGLANG_BIN"],
		"AGENT_VAR_port="+vars["PORT"], "AGENT_VAR_listen="+listen)
	getenv := func(k string) string {
		if k == "HOSTNAME" {
			h, _ := os.Hostname()
			return h
		}
		return vars[k]
	}
	agentCmd := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Dir, cmd.Env = dir, env
		return cmd
	}
	// check runs one command, wants its exit code, and checks its document.
	check := func(golden string, code int, args ...string) []byte {
		t.Helper()
		var stdout, stderr bytes.Buffer
		cmd := agentCmd(append(args, "--json")...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		got := 0
		if errors.As(err, &ee) {
			got = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if got != code {
			t.Errorf("agent %s: exit code %d, want %d\n%s%s", strings.Join(args, " "), got, code, stdout.String(), stderr.String())
		}
		checkDocument(t, golden, stdout.Bytes(), getenv)
		return stdout.Bytes()
	}
	sd := "--state-dir=" + stateDir

	check("validate", 0, "validate", "plan.hcl")
	check("validate_invalid", 1, "validate", "bad.hcl")
	check("plan_invalid", 1, "plan", "bad.hcl", sd)
	check("plan_wrong_host", 1, "plan", "host.hcl", sd)
	check("plan_create", 2, "plan", "plan.hcl", sd)
	check("apply_create", 0, "apply", "plan.hcl", sd)
	check("status", 0, "status", "plan.hcl", sd)
	// Saved too (agent plan -out): show --json prints the same document, from the file.
	check("plan_restart", 2, "plan", "plan.hcl", sd, "-var", "token=hf_other_secret", "-out", "restart.plan")
	check("plan_restart", 0, "show", "restart.plan")
	if b, err := os.ReadFile(filepath.Join(dir, "restart.plan")); err != nil || bytes.Contains(b, []byte("hf_other_secret")) || bytes.Contains(b, []byte("hf_planted_secret")) {
		t.Errorf("the saved plan (%v) holds a secret:\n%s", err, b)
	}
	// It is refused once a managed file was edited by hand (then put back as it was).
	motd := filepath.Join(dir, "root", "motd")
	if err := os.WriteFile(motd, []byte("by hand\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("apply_saved_stale", 1, "apply", "restart.plan", "-var", "token=hf_other_secret")
	if err := os.WriteFile(motd, []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("apply_failed", 1, "apply", "fail.hcl", "--state-dir="+filepath.Join(dir, "state-fail"))

	// Another agent holds the lock.
	store, err := state.Open(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := store.Acquire(context.Background(), 0, "agent apply plan.hcl")
	if err != nil {
		t.Fatal(err)
	}
	check("apply_locked", 1, "apply", "plan.hcl", sd)
	lock.Release()

	// agent run holds the host: apply is refused, status is its answer.
	run := agentCmd("run", "plan.hcl", sd, "--listen", listen, "--interval", "1h")
	var runLog bytes.Buffer
	run.Stdout, run.Stderr = &runLog, &runLog
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			run.Process.Signal(syscall.SIGTERM)
			run.Wait()
		}
	}
	defer stop()
	if doc := daemonStatus(t, "http://"+listen); doc == nil {
		t.Fatalf("agent run did not converge; its log:\n%s", runLog.String())
	} else {
		checkDocument(t, "run_status_endpoint", doc, getenv)
	}
	check("apply_refused_by_run", 1, "apply", "plan.hcl", sd)
	if doc := check("status_from_run", 0, "status", "plan.hcl", sd); !strings.Contains(string(doc), `"state_dir": `) {
		t.Errorf("agent status --json did not come from agent run:\n%s", doc)
	}
	stop()

	// The server dies: status is degraded, and says what its log said last.
	var rec struct {
		PID int `json:"pid"`
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, "resources", "server.qwen.json")); err != nil || json.Unmarshal(b, &rec) != nil || rec.PID == 0 {
		t.Fatalf("no server record: %v", err)
	}
	syscall.Kill(rec.PID, syscall.SIGKILL)
	for i := 0; i < 100 && syscall.Kill(rec.PID, 0) == nil && !zombie(rec.PID); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	check("status_degraded", 3, "status", "plan.hcl", sd)

	check("destroy", 0, "destroy", "plan.hcl", sd)
}

// checkDocument validates doc against the schema, keeps secrets out, and compares it,
// normalized, with testdata/json/NAME.json.
func checkDocument(t *testing.T, name string, doc []byte, getenv func(string) string) {
	t.Helper()
	if err := schema.Validate(doc); err != nil {
		t.Errorf("%s: the document breaks %s: %v\n%s", name, schema.OutputV3Name, err, doc)
	}
	if bytes.Contains(doc, []byte("hf_planted_secret")) || bytes.Contains(doc, []byte("hf_other_secret")) {
		t.Errorf("%s: a secret in the document:\n%s", name, doc)
	}
	var d view.JSONOutput
	if err := json.Unmarshal(doc, &d); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, r := range d.Resources {
		if r.Status == nil {
			continue
		}
		seen := map[string]bool{}
		for _, f := range r.Status.Fields {
			if seen[f.Key] {
				t.Errorf("%s: %s has two fields with the key %q", name, r.Address, f.Key)
			}
			seen[f.Key] = true
		}
	}
	checkGolden(t, filepath.Join("json", name+".json"), normalizeJSON(getenv, string(doc)))
}

// zombie reports whether pid has exited and waits for its parent to reap it.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] == "Z"
}

// daemonStatus waits until agent run's /status says every resource converged (each
// reconciled, none failing) and returns that document; nil after a minute.
func daemonStatus(t *testing.T, base string) []byte {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		resp, err := http.Get(base + "/status")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var doc view.JSONOutput
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &doc) != nil || !doc.OK || len(doc.Resources) != 3 {
			continue
		}
		converged := true
		for _, r := range doc.Resources {
			converged = converged && r.Error == "" && r.Status != nil && hasKey(r.Status.Fields, "reconciled_at")
		}
		if converged {
			return body
		}
	}
	return nil
}

func hasKey(fields []agent.Field, key string) bool {
	for _, f := range fields {
		if f.Key == key {
			return true
		}
	}
	return false
}
