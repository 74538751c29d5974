// Package quickstart_test runs the README's first command, examples/quickstart/run.sh,
// end to end: it must build, apply, re-plan as a no-op, relaunch on a changed flag with
// verification, report status, and leave nothing running.
package quickstart_test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestQuickstart(t *testing.T) {
	root := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command("sh", "run.sh")
	cmd.Env = append(os.Environ(), "QUICKSTART_ROOT="+root, "QUICKSTART_PORT="+strconv.Itoa(port))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run.sh: %v\n%s", err, out)
	}
	for _, want := range []string{
		"Plan: 3 to create",
		"✓ server.qwen: created and verified",
		"No changes. The host matches the plan (3 resources).",
		`~ flags["mem-fraction-static"]: 0.85 → 0.8  (restart)`,
		"✓ server.qwen: restarted and verified",
		"server.qwen: running, ready, generation 2",
		"accept rate                 0.97",
		"smoke test                  passed",
		"- server.qwen (delete)",
		"✓ server.qwen: deleted and verified",
		"✓ file.weights: deleted and verified",
		"Destroy complete: 3 changed, all verified",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
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
	if _, err := os.Stat(filepath.Join(root, "models", "Qwen3.6-27B", "config.json")); err == nil {
		t.Error("agent destroy left the plan's files")
	}
}
