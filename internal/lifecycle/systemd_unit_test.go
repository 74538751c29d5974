package lifecycle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestUnitName(t *testing.T) {
	got := unitName(LogFile{Name: "qwen 3/x", Generation: 7}, time.Unix(0, 255))
	if got != "agent-server-qwen_3_x-7-ff.service" {
		t.Errorf("unitName = %q", got)
	}
}

func TestUnitInCgroup(t *testing.T) {
	for data, want := range map[string]string{
		"0::/system.slice/agent-server-qwen-3-18ed7fa07aa8b6cd.service\n":            "agent-server-qwen-3-18ed7fa07aa8b6cd.service",
		"12:pids:/\n1:name=systemd:/system.slice/agent-server-q-1-a.service\n0::/\n": "agent-server-q-1-a.service",
		"0::/system.slice/agent.service\n":                                           "",
		"4:memory:/system.slice/agent-server-q-1-a.service\n0::/user.slice\n":        "", // a controller's hierarchy is no proof
		"0::/system.slice/agent-server-q-1-a.service/child\n":                        "agent-server-q-1-a.service",
		"0::/system.slice/agent-server-q-1-a.scope\n":                                "",
		"garbage": "",
	} {
		if got := unitInCgroup(data); got != want {
			t.Errorf("unitInCgroup(%q) = %q, want %q", data, got, want)
		}
	}
	// This test process is in no server unit.
	if u := UnitOf(os.Getpid()); u != "" {
		t.Errorf("UnitOf(self) = %q", u)
	}
}

func TestLookPathUsesTheServersPATH(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "serve")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := lookPath("serve", []string{"HOME=/x", "PATH=/nonexistent:" + dir}); err != nil || got != prog {
		t.Errorf("lookPath = %q, %v", got, err)
	}
	if _, err := lookPath("serve", []string{"PATH=/nonexistent"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("lookPath outside PATH: %v", err)
	}
	if got, _ := lookPath("/abs/prog", nil); got != "/abs/prog" {
		t.Errorf("absolute: %q", got)
	}
}

func TestSystemdRunsCanBeTurnedOff(t *testing.T) {
	t.Setenv("AGENT_NO_SYSTEMD_UNITS", "1")
	if systemdRuns() {
		t.Error("AGENT_NO_SYSTEMD_UNITS=1 did not turn transient units off")
	}
}
