package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
)

const planWithVar = `
variable "root" {}
variable "value" {}
mark "a" {
  path  = "${var.root}/a"
  value = var.value
}
`

// replace writes path beside and renames it in place, as editors and git do.
func replace(t *testing.T, path, src string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// withVarFiles loads the plan with var files (and the test's root variable).
func withVarFiles(files ...string) func(h *harness, c *Config) {
	return func(h *harness, c *Config) {
		kinds := c.Kinds
		c.Load = func() (*plans.Plan, hcl.Diagnostics) {
			return plans.Load(h.plan, plans.Options{Schemas: agent.Schemas(kinds), Vars: []string{"root=" + h.dir}, VarFiles: files})
		}
	}
}

func fileIs(path, want string) func() bool {
	return func() bool { b, _ := os.ReadFile(path); return string(b) == want }
}

// Issue 27, point 4: a var file below the plan's directory (hosts/kpro5.vars.hcl, the
// layout docs/fleet.md recommends) and one elsewhere are watched like the plan itself: an
// edit, or a `git pull` that replaces them, is picked up without SIGHUP.
func TestVarFilesAreWatchedWhereverTheyLive(t *testing.T) {
	t.Parallel()
	elsewhere := filepath.Join(t.TempDir(), "fleet", "common.vars.hcl")
	replace(t, elsewhere, `value = "v1"`)
	var host string
	h := startTuned(t, planWithVar, time.Hour, func(h *harness, c *Config) {
		host = filepath.Join(h.dir, "hosts", "kpro5.vars.hcl")
		replace(t, host, ``)
		withVarFiles(elsewhere, host)(h, c)
	})
	a := filepath.Join(h.dir, "a")
	waitFor(t, "v1 applied", fileIs(a, "v1"))
	replace(t, host, `value = "v2"`) // the host's file overrides the common one
	waitFor(t, "the host var file's edit applied", fileIs(a, "v2"))
	replace(t, host, ``)
	replace(t, elsewhere, `value = "v3"`)
	waitFor(t, "the other var file's edit applied", fileIs(a, "v3"))
}

// Issue 27, point 5: a var file replaced by a FIFO is refused at once, naming it (before,
// the reload hung on it: later edits were ignored and SIGTERM waited for a writer), and
// the next edit is picked up.
func TestAFIFOVarFileNeitherHangsTheLoopNorHidesLaterEdits(t *testing.T) {
	t.Parallel()
	var vars string
	h := startTuned(t, planWithVar, time.Hour, func(h *harness, c *Config) {
		vars = filepath.Join(h.dir, "host.vars.hcl")
		replace(t, vars, `value = "v1"`)
		withVarFiles(vars)(h, c)
	})
	a := filepath.Join(h.dir, "a")
	waitFor(t, "v1 applied", fileIs(a, "v1"))
	fifo := vars + ".fifo"
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(fifo, vars); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the FIFO refused, by its path", func() bool {
		return strings.Contains(h.log.String(), vars+" is a named pipe (FIFO)")
	})
	if code, body := h.get(t, "/healthz"); code != 200 || !strings.Contains(body, vars+" is a named pipe (FIFO)") {
		t.Errorf("/healthz does not say what is wrong: %d %q", code, body)
	}
	replace(t, vars, `value = "v2"`)
	waitFor(t, "the next edit applied", fileIs(a, "v2"))
}

// Issue 27, point 5: a load that blocks (a hung network filesystem: here the test's Load
// waits) never holds the loop: /healthz answers and says the load is taking long, the
// load is abandoned at its deadline with an error naming the plan's files, a later edit
// is loaded, and a stop is honoured at once.
func TestABlockedLoadNeverHoldsTheLoop(t *testing.T) {
	t.Parallel()
	var block atomic.Bool
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	h := startTuned(t, planV1, time.Hour, func(h *harness, c *Config) {
		kinds := c.Kinds
		c.LoadTimeout = 3 * time.Second
		c.Load = func() (*plans.Plan, hcl.Diagnostics) {
			if block.Load() {
				<-release
			}
			return plans.Load(h.plan, plans.Options{Schemas: agent.Schemas(kinds), Vars: []string{"root=" + h.dir}})
		}
	})
	a := filepath.Join(h.dir, "a")
	waitFor(t, "v1 applied", fileIs(a, "v1"))
	block.Store(true)
	h.write(t, strings.Replace(planV1, "v1", "v2", 1))
	waitFor(t, "/healthz saying the load takes long", func() bool {
		code, body := h.get(t, "/healthz")
		return code == 200 && strings.Contains(body, "loading the plan has taken")
	})
	waitFor(t, "the load abandoned at its deadline", func() bool {
		_, body := h.get(t, "/healthz")
		return strings.Contains(body, "did not finish within 3s") && strings.Contains(body, h.plan)
	})
	block.Store(false)
	h.write(t, strings.Replace(planV1, "v1", "v3", 1))
	waitFor(t, "a later edit applied", fileIs(a, "v3"))
	block.Store(true)
	h.write(t, strings.Replace(planV1, "v1", "v4", 1))
	waitFor(t, "a load in flight", func() bool { _, body := h.get(t, "/healthz"); return strings.Contains(body, "loading the plan") })
	stopped := time.Now()
	h.cancel()
	select {
	case <-h.done:
		h.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the stop waited for the load")
	}
	if took := time.Since(stopped); took > 5*time.Second {
		t.Errorf("the stop took %s", took)
	}
}

// Issue 27, point 6: a plan made invalid (its var file vanished) shows in /status: ok
// false and the error, naming the file; the log line has no "<nil>:" prefix.
func TestInvalidPlanShowsInStatus(t *testing.T) {
	t.Parallel()
	var vars string
	h := startTuned(t, planWithVar, time.Hour, func(h *harness, c *Config) {
		vars = filepath.Join(h.dir, "hosts", "kpro5.vars.hcl")
		replace(t, vars, `value = "v1"`)
		withVarFiles(vars)(h, c)
	})
	waitFor(t, "v1 applied", fileIs(filepath.Join(h.dir, "a"), "v1"))
	if err := os.Remove(vars); err != nil {
		t.Fatal(err)
	}
	var doc view.JSONOutput
	waitFor(t, "/status not ok, with an error", func() bool {
		_, body := h.get(t, "/status")
		doc = view.JSONOutput{}
		return json.Unmarshal([]byte(body), &doc) == nil && !doc.OK && doc.Error != ""
	})
	if !strings.Contains(doc.Error, "the plan on disk is invalid") || !strings.Contains(doc.Error, vars) {
		t.Errorf("/status error = %q", doc.Error)
	}
	if log := h.log.String(); strings.Contains(log, "<nil>") {
		t.Errorf("the log has a <nil> prefix:\n%s", log)
	}
	// Back: ok again.
	replace(t, vars, `value = "v1"`)
	waitFor(t, "/status ok again", func() bool {
		_, body := h.get(t, "/status")
		doc = view.JSONOutput{}
		return json.Unmarshal([]byte(body), &doc) == nil && doc.OK && doc.Error == ""
	})
}
