package rollout_test

// TestRolloutEndToEnd (issue 18, point 4): three fake SGLang servers in one rollout group
// (max_unavailable = 1), driven by the real agent binary, while a poller asks each
// server's /health every few milliseconds and keeps the most that were down at once.
//
//  1. A flag change restarts them one at a time, in the plan's order, each verified
//     (ready, settled, smoke-tested) before the next stops.
//  2. A change whose relaunch fails on the 2nd (an OOM at start): the apply fails with
//     the member's name and its log's quote, and the 3rd is untouched (same process)
//     and serving throughout.
//  3. The fix is applied: the failed member is repaired first, then the rest.
//  4. SIGKILL of the agent while a member is down mid-rollout: rollouts.json names that
//     member; the next apply finishes it first and then the rest.
//  5. A member killed before the apply counts as unavailable: it is repaired first and no
//     healthy member is stopped until it serves again.
//
// At no moment after the first deployment does the poller see two servers down.

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

var members = []string{"a", "b", "c"}

func plan(ports []int) string {
	var b strings.Builder
	b.WriteString(`
variable "fake" {}
variable "logs" {}
variable "mem" { default = 0.8 }
variable "faults_b" { default = "" }
`)
	for i, m := range members {
		faults := `""`
		if m == "b" {
			faults = "var.faults_b"
		}
		b.WriteString(testbin.GroupServer{Name: "qwen_" + m, Command: "var.fake", Port: strconv.Itoa(ports[i]),
			Mem: "var.mem", Env: faults, Settle: "1s", LogDir: "var.logs", Group: "qwen"}.HCL())
	}
	return b.String()
}

// serverPID is the PID the state record of server.qwen_<m> names.
func serverPID(t *testing.T, state, m string) int {
	t.Helper()
	var rec struct {
		PID int `json:"pid"`
	}
	b, err := os.ReadFile(filepath.Join(state, "resources", "server.qwen_"+m+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.PID == 0 {
		t.Fatalf("record of server.qwen_%s: %v %s", m, err, b)
	}
	return rec.PID
}

func TestRolloutEndToEnd(t *testing.T) {
	testbin.Long(t, "builds the agent and runs three servers")
	work := t.TempDir()
	agentBin, fakeBin := testbin.Agent(t), testbin.FakeSGLang(t)
	state := filepath.Join(work, "state")
	logs := filepath.Join(work, "logs")
	ports := []int{testbin.FreePort(t), testbin.FreePort(t), testbin.FreePort(t)}
	planFile := filepath.Join(work, "plan.hcl")
	if err := os.WriteFile(planFile, []byte(plan(ports)), 0o644); err != nil {
		t.Fatal(err)
	}
	testbin.NoLeaks(t, work)
	t.Cleanup(func() { testbin.KillServers(work) }) // servers' HOME: <state>/home

	command := func(args ...string) *exec.Cmd {
		args = append(args, "--state-dir", state, "-var", "fake="+fakeBin, "-var", "logs="+logs)
		cmd := exec.Command(agentBin, args...)
		cmd.Env = append(os.Environ(), "HOME="+work)
		return cmd
	}
	run := func(want int, args ...string) string {
		t.Helper()
		cmd := command(args...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		rc := 0
		if ee, ok := err.(*exec.ExitError); ok {
			rc = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if rc != want {
			t.Fatalf("agent %s: exit %d, want %d\n%s", strings.Join(args, " "), rc, want, out.String())
		}
		return out.String()
	}
	order := func(out string) []string {
		var got []string
		for _, line := range strings.Split(out, "\n") {
			if a, ok := strings.CutPrefix(strings.TrimSpace(line), "… server.qwen_"); ok {
				got = append(got, strings.SplitN(a, ":", 2)[0])
			}
		}
		return got
	}

	run(0, "apply", planFile) // the first deployment: nothing served yet, all at once
	// The poller: every server's /health every 5 ms.
	p := testbin.WatchHealth(ports, 5*time.Millisecond)
	defer func() {
		r := p.Stop()
		t.Logf("poller: %d samples, down samples per port %v, peak %d (%s)", r.Samples, r.Downs, r.Peak, r.PeakAt())
		if r.Peak > 1 {
			t.Errorf("%d servers of the group were down at once (%s); max_unavailable is 1", r.Peak, r.PeakAt())
		}
		if len(r.Downs) < len(ports) {
			t.Errorf("the poller saw only ports %v down: it did not watch the restarts", r.Downs)
		}
	}()

	// 1. A flag change: one at a time, in the plan's order.
	out := run(2, "plan", planFile, "-var", "mem=0.85")
	if !strings.Contains(out, "rollout qwen: 3 restarts, 1 at a time") {
		t.Errorf("plan does not show the rollout:\n%s", out)
	}
	out = run(0, "apply", planFile, "-var", "mem=0.85")
	if got := strings.Join(order(out), ","); got != "a,b,c" {
		t.Errorf("restarted in order %s, want a,b,c\n%s", got, out)
	}
	// Each verified (ready, settled, smoke-tested, checked again) before the next starts.
	for _, pair := range [][2]string{{"✓ server.qwen_a: restarted and verified", "… server.qwen_b: restarting"},
		{"✓ server.qwen_b: restarted and verified", "… server.qwen_c: restarting"}} {
		if i, j := strings.Index(out, pair[0]), strings.Index(out, pair[1]); i < 0 || j < 0 || i > j {
			t.Errorf("%q does not come before %q:\n%s", pair[0], pair[1], out)
		}
	}

	// 2. The relaunch of the 2nd fails: the 3rd is untouched and keeps serving.
	pidC := serverPID(t, state, "c")
	out = run(1, "apply", planFile, "-var", "mem=0.9", "-var", "faults_b=oom")
	t.Logf("the stopped rollout:\n%s", out)
	for _, want := range []string{
		"server.qwen_c: skipped: rollout qwen stopped: server.qwen_b failed: restart: ",
		"CUDA out of memory",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("failed apply lacks %q:\n%s", want, out)
		}
	}
	if got := strings.Join(order(out), ","); got != "a,b" {
		t.Errorf("acted on %s, want a,b\n%s", got, out)
	}
	if pid := serverPID(t, state, "c"); pid != pidC || syscall.Kill(pidC, 0) != nil {
		t.Errorf("server.qwen_c was touched: pid %d → %d", pidC, pid)
	}
	if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(ports[2]) + "/health"); err != nil || resp.StatusCode != 200 {
		t.Errorf("server.qwen_c does not serve after the stopped rollout: %v", err)
	} else {
		resp.Body.Close()
	}

	// 3. The fix: the failed member first, then the rest.
	out = run(0, "apply", planFile, "-var", "mem=0.9")
	if got := strings.Join(order(out), ","); got != "b,c" {
		t.Errorf("after the fix acted on %s, want b,c\n%s", got, out)
	}

	// 4. SIGKILL mid-rollout, while a member is down: the next apply resumes it first.
	cmd := command("apply", planFile, "-var", "mem=0.95")
	var killed bytes.Buffer
	cmd.Stdout, cmd.Stderr = &killed, &killed
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var inFlight string
	for inFlight == "" {
		if ctx.Err() != nil {
			cmd.Process.Kill()
			t.Fatalf("no member went down in flight:\n%s", killed.String())
		}
		var m map[string]struct{ Action string }
		if b, err := os.ReadFile(filepath.Join(state, "rollouts.json")); err == nil && json.Unmarshal(b, &m) == nil {
			for addr := range m {
				i := strings.IndexByte("abc", addr[len(addr)-1])
				if i < 0 || addr != "server.qwen_"+members[i] || m[addr].Action != "restart" {
					continue
				}
				// Down: stopped by the agent (its old generation gone, the new one not
				// ready yet).
				if resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(ports[i]) + "/health"); err != nil || resp.StatusCode != 200 {
					inFlight = members[i]
				} else {
					resp.Body.Close()
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if inFlight != "a" {
		t.Errorf("the member in flight was %s, want a (declared first)", inFlight)
	}
	out = run(0, "apply", planFile, "-var", "mem=0.95")
	// The member in flight acts first (unless the killed agent's launch came up and is
	// verified converged as it is), then the two others.
	got := order(out)
	if want := []string{"a", "b", "c"}; strings.Join(got, ",") != strings.Join(want, ",") && strings.Join(got, ",") != "b,c" {
		t.Errorf("the resumed apply acted on %v, want %s (in flight when killed) first, then the others\n%s", got, inFlight, out)
	}
	if _, err := os.Stat(filepath.Join(state, "rollouts.json")); !os.IsNotExist(err) {
		t.Errorf("rollouts.json left after the rollout completed: %v", err)
	}
	out = run(0, "plan", planFile, "-var", "mem=0.95")
	if !strings.Contains(out, "No changes") {
		t.Errorf("not converged after the resumed rollout:\n%s", out)
	}

	// 5. A member already down counts as unavailable: with server.qwen_b killed, a flag
	// change repairs b first (its relaunch carries the change) and disrupts a and c only
	// after it is verified; the poller sees b down, never b with another.
	pidB := serverPID(t, state, "b")
	if err := syscall.Kill(-pidB, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone := time.Now().Add(30 * time.Second)
	for syscall.Kill(pidB, 0) == nil && time.Now().Before(waitGone) {
		time.Sleep(10 * time.Millisecond) // a zombie counts as gone on this machine's PID 1
		if b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pidB), "stat")); err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
	}
	out = run(2, "plan", planFile, "-var", "mem=0.99")
	if !strings.Contains(out, "rollout qwen: 2 restarts, 1 at a time; server.qwen_b down") {
		t.Errorf("plan does not show the member down:\n%s", out)
	}
	out = run(0, "apply", planFile, "-var", "mem=0.99")
	if got := strings.Join(order(out), ","); got != "b,a,c" {
		t.Errorf("with b down acted on %s, want b (repaired first), then a, c\n%s", got, out)
	}
}
