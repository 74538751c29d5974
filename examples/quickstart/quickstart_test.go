// Package quickstart_test runs the README's first command, examples/quickstart/run.sh,
// end to end: it must build, download the model from its loopback server, launch the
// server from the downloaded directory, re-plan as a no-op, relaunch on a changed flag
// with verification, report status, and leave nothing running (agent destroy).
package quickstart_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

func TestQuickstart(t *testing.T) {
	root := t.TempDir()
	port := testbin.FreePort(t)
	cmd := exec.Command("sh", "run.sh")
	cmd.Env = append(os.Environ(), "QUICKSTART_ROOT="+root, "QUICKSTART_PORT="+strconv.Itoa(port))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Plan: 2 to create",
		`+ file["model.safetensors"]: download 16.0 MiB`,
		"✓ download.model: created and verified",
		"--model-path " + filepath.Join(root, "models", "Qwen3.6-27B") + "\n",
		"✓ server.qwen: created and verified",
		"No changes. The host matches the plan (2 resources).",
		`~ flags["mem-fraction-static"]: 0.85 → 0.8  (restart, weights warmed before the stop)`,
		"✓ server.qwen: restarted and verified",
		"server.qwen: running, ready, generation 2",
		"accept rate                 0.97",
		"smoke test                  passed",
		"- server.qwen (delete)",
		"✓ server.qwen: deleted and verified",
		"✓ download.model: deleted and verified",
		"Destroy complete: 2 changed, all verified",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Saved output (not a terminal) holds no escape code: no bold, no progress bars.
	if i := strings.Index(string(out), "\x1b["); i >= 0 {
		t.Errorf("the saved output holds an escape code at byte %d: %q", i, out[max(0, i-40):min(len(out), i+20)])
	}
	if !strings.Contains(string(out), "\n$ agent apply examples/quickstart\n") {
		t.Errorf("the commands are not shown plainly:\n%s", out)
	}
	// Generation 1's log is kept and never reused; the current link points at generation 2.
	link, err := os.Readlink(filepath.Join(root, "logs", "qwen.log"))
	if err != nil || filepath.Base(link) != "qwen.2.log" {
		t.Errorf("qwen.log → %q, %v; want qwen.2.log", link, err)
	}
	if _, err := os.Stat(filepath.Join(root, "logs", "qwen.1.log")); err != nil {
		t.Errorf("generation 1's log: %v", err)
	}
	// agent destroy left nothing running: the record says who stopped generation 2 and
	// when, and its PID is gone (a zombie, with no reaper here, counts as gone).
	var rec struct {
		PID       int       `json:"pid"`
		StoppedAt time.Time `json:"stopped_at"`
		StoppedBy string    `json:"stopped_by"`
	}
	data, err := os.ReadFile(filepath.Join(root, "state", "resources", "server.qwen.json"))
	if err != nil || json.Unmarshal(data, &rec) != nil || rec.StoppedAt.IsZero() || !strings.HasPrefix(rec.StoppedBy, "agent") {
		t.Fatalf("server record after destroy: %s %v", data, err)
	}
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(rec.PID) + "/stat"); err == nil {
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] != "Z" {
			t.Errorf("pid %d still runs after agent destroy: %s", rec.PID, stat)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "models", "Qwen3.6-27B", "model.safetensors")); err == nil {
		t.Error("agent destroy left the downloaded weights")
	}
	// The download happened, from run.sh's own loopback server: it sent every byte of the
	// model directory once, and the no-op plan and the relaunch asked it for nothing.
	if served := servedBytes(t, filepath.Join(root, "origin.log")); served != quickstartModelBytes {
		log, _ := os.ReadFile(filepath.Join(root, "origin.log"))
		t.Errorf("the model server sent %d bytes, want %d (each file once):\n%s", served, quickstartModelBytes, log)
	}
}

// quickstartModelBytes is the model directory's size: config.json, tokenizer.json and the
// placeholder weights, as quickstart.hcl pins them.
const quickstartModelBytes = 97 + 111 + testbin.QuickstartWeightsSize

// servedBytes adds up the body bytes a bench/downloadserve -log sent.
func servedBytes(t *testing.T, logPath string) int64 {
	t.Helper()
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatalf("the model server's log: %v", err)
	}
	var n int64
	for _, m := range regexp.MustCompile(`(?m) bytes=(\d+)$`).FindAllStringSubmatch(string(data), -1) {
		b, _ := strconv.ParseInt(m[1], 10, 64)
		n += b
	}
	return n
}

// The no-op plan confirms the downloaded weights from the destination's manifest and a
// stat: it neither asks the model server again nor reads the 16 MiB back. Proof: the
// weights are overwritten in place (same size, same mtime) after the apply, and the plan
// still says no changes, while the server was sent nothing more.
func TestQuickstartNoOpPlanReadsNoWeights(t *testing.T) {
	agentBin, fakeBin := testbin.Agent(t), testbin.FakeSGLang(t)
	origin := testbin.QuickstartModel(t)
	root, port := t.TempDir(), strconv.Itoa(testbin.FreePort(t))
	testbin.NoLeaks(t, root)
	t.Cleanup(func() { testbin.KillServers(root) })
	agent := func(args ...string) (string, error) {
		args = append(args, "quickstart.hcl", "--state-dir", filepath.Join(root, "state"), "-var", "root="+root,
			"-var", "fake_sglang="+fakeBin, "-var", "model_url="+origin.URL, "-var", "port="+port,
			"-var", "metrics_listen=127.0.0.1:1")
		out, err := exec.Command(agentBin, args...).CombinedOutput()
		return string(out), err
	}
	if out, err := agent("apply"); err != nil || !strings.Contains(out, "✓ download.model: created and verified") {
		t.Fatalf("agent apply: %v\n%s", err, out)
	}
	if sent := origin.Sent(); sent != quickstartModelBytes {
		t.Fatalf("the model server sent %d bytes for the apply, want %d", sent, quickstartModelBytes)
	}
	weights := filepath.Join(root, "models", "Qwen3.6-27B", "model.safetensors")
	st, err := os.Stat(weights)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(weights, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("not zeros: a plan that read this would see it"), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(weights, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	out, err := agent("plan")
	if err != nil || !strings.Contains(out, "No changes. The host matches the plan (2 resources).") {
		t.Errorf("agent plan after the apply: %v\n%s", err, out)
	}
	if sent := origin.Sent(); sent != quickstartModelBytes {
		t.Errorf("the no-op plan asked the model server again: %d bytes sent in all, want %d", sent, quickstartModelBytes)
	}
	if out, err := agent("destroy"); err != nil {
		t.Errorf("agent destroy: %v\n%s", err, out)
	}
}
