package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestBuildsOnceAndSweepsDeadProcesses(t *testing.T) {
	// A leftover of a test process that is gone (PID 2^22+1 does not exist).
	stale := filepath.Join(os.TempDir(), "agent-testbin-4194305")
	os.MkdirAll(stale, 0o755)
	a, b := FakeSGLang(t), FakeSGLang(t)
	if a != b {
		t.Errorf("built twice: %s, %s", a, b)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead process's directory was kept: %v", err)
	}
	out, _ := exec.Command(a, "--model-path", "m", "--bogus-flag").CombinedOutput()
	if !strings.Contains(string(out), "unrecognized arguments: --bogus-flag") {
		t.Errorf("the fake did not answer as SGLang: %s", out)
	}
	if FreePort(t) <= 0 {
		t.Error("no port")
	}
}
