// Package quickstart_test runs the README's first command, examples/quickstart/run.sh,
// end to end: it must build, apply, re-plan as a no-op, relaunch on a changed flag with
// verification, report status, and leave nothing running.
package quickstart_test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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
}
