package server

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources/restest"
)

// killedMidLaunch runs a real `agent apply` of the fake server with faults, SIGKILLs it
// once it has recorded the launched process (the server still loading), and returns the
// record, the state directory and what the next agent needs to run.
func killedMidLaunch(t *testing.T, faults string) (rec serverRecord, stateDir, home string, args []string) {
	t.Helper()
	dir := t.TempDir()
	testbin.NoLeaks(t, dir)
	home = filepath.Join(dir, "home")
	os.Mkdir(home, 0o700)
	// The agent's HOME is dir/home, its servers' is <state dir>/home = dir/state/home:
	// look for them under dir.
	t.Cleanup(func() { testbin.KillServers(dir) })
	plan := writeSrvPlan(t, dir, filepath.Join(dir, "logs"), srvFreePort(t), faults)
	stateDir = filepath.Join(dir, "state")
	args = []string{"--state-dir", stateDir, "-var-file", filepath.Join(dir, "plan.vars.hcl"), plan}

	cmd := exec.Command(testbin.Agent(t), append([]string{"apply"}, args...)...)
	cmd.Env = []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	store := (*state.Store)(nil)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the agent never recorded its launch:\n%s", out.String())
		}
		if store == nil {
			if _, err := os.Stat(filepath.Join(stateDir, "resources")); err != nil {
				continue
			}
			s, err := state.Open(stateDir)
			if err != nil {
				continue
			}
			store = s
		}
		var r serverRecord // fresh: Unmarshal leaves fields the file omits as they were
		if ok, _ := store.Load("server.qwen", &r); ok && r.PID != 0 && r.Pending == nil {
			rec = r
			break
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if !alive(rec.id()) {
		t.Fatal("the server died with the agent: it must outlive it")
	}
	return rec, stateDir, home, args
}

// Point 3: an agent killed while its new server was not yet ready leaves a launch
// recorded but never verified. The next apply does not call it converged: it verifies it,
// and when the server then dies of OOM, the apply fails quoting that launch's own log.
func TestServerKilledAgentsLaunchIsVerifiedByTheNextApply(t *testing.T) {
	t.Parallel()
	t.Run("dies", func(t *testing.T) {
		t.Parallel()
		rec, _, home, args := killedMidLaunch(t, "slow-start=8s,oom")
		code, out := runAgent(t, home, append([]string{"apply"}, args...)...)
		if code != 1 || strings.Contains(out, "No changes") || !strings.Contains(out, "launch of generation 1 failed") ||
			!strings.Contains(out, "CUDA out of memory") || !strings.Contains(out, rec.LogPath) {
			t.Fatalf("the next apply: exit %d, want 1 with generation 1's own log quoted:\n%s", code, out)
		}
		if alive(rec.id()) {
			t.Error("the failed launch was left running")
		}
		// status names the failure of that generation, from its log.
		code, out = runAgent(t, home, append([]string{"status"}, args...)...)
		if code == 0 || !strings.Contains(out, "out of GPU memory") {
			t.Errorf("status: exit %d:\n%s", code, out)
		}
	})
	t.Run("comes up", func(t *testing.T) {
		t.Parallel()
		rec, stateDir, home, args := killedMidLaunch(t, "slow-start=4s")
		code, out := runAgent(t, home, append([]string{"apply"}, args...)...)
		if code != 0 || !strings.Contains(out, "verif") {
			t.Fatalf("the next apply: exit %d, want 0 and the verification shown:\n%s", code, out)
		}
		var after serverRecord
		if ok, err := restest.OpenStore(t, stateDir).Load("server.qwen", &after); !ok || err != nil || after.id() != rec.id() || after.VerifiedAt.IsZero() {
			t.Fatalf("record after the verification: %+v (%v), want pid %d verified in place", after, err, rec.PID)
		}
		code, out = runAgent(t, home, append([]string{"plan"}, args...)...)
		if code != 0 || !strings.Contains(out, "No changes") {
			t.Errorf("plan after the verification: exit %d:\n%s", code, out)
		}
	})
}

// Point 5: a server that dies two seconds after it answered ready is a failed launch,
// not a verified one: ready.settle keeps watching it, and the error quotes its log.
func TestServerThatDiesAfterReadyFailsTheSettle(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	st := h.apply("faults=crash-after=2s", "settle=6s")
	if st.Err == nil {
		t.Fatal("a server that died 2 s after ready was reported verified")
	}
	msg := st.Err.Error()
	for _, want := range []string{"launch of generation 1 failed", "after it answered ready (ready.settle 6s)", "Scheduler hit an exception", "qwen.1.log"} {
		if !strings.Contains(msg, want) {
			t.Errorf("apply error lacks %q:\n%s", want, msg)
		}
	}
	r := h.record()
	if !r.VerifiedAt.IsZero() || r.Failure == nil || alive(r.id()) {
		t.Errorf("record %+v, want an unverified launch with its failure", r)
	}
	// A settled server passes, and the default settle period is a few seconds.
	mustOK(t, h.apply("settle=1s"))
	if r := h.record(); r.VerifiedAt.IsZero() || r.VerifiedAt.Sub(r.ReadyAt) < time.Second {
		t.Errorf("record %+v: verified before it settled", r)
	}
	if s, diags := restest.BindPlan("server \"s\" {\n  command = [\"x\"]\n}\n", kinds()); diags.HasErrors() || s["server.s"].(*Server).ready.Settle != DefaultSettle {
		t.Errorf("default settle: %v", diags)
	}
}
