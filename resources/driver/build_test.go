package driver

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
)

// Issue 6 point 4: the agent builds with CGO_ENABLED=0 (no NVML) and, pointed at a fake
// host root, validates and reports an nvidia_driver through the procfs fallback.
func TestDriverAgentWithoutCGO(t *testing.T) {
	testbin.Long(t, "builds the agent")
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		testbin.Missing(t, "no go command on PATH", "install Go")
	}
	bin := filepath.Join(t.TempDir(), "agent")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}

	dir := t.TempDir()
	plan := filepath.Join(dir, "plan.hcl")
	os.WriteFile(plan, []byte(`
variable "driver_version" {}
nvidia_driver "host" {
  version = var.driver_version
}
`), 0o644)
	run := func(root string, args ...string) (string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), resources.HostRootEnv+"="+root)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := run("", "validate", plan, "-var", "driver_version=580.95.05"); code != 0 || !strings.Contains(out, "The plan is valid: 1 resources.") {
		t.Fatalf("validate: exit %d\n%s", code, out)
	}
	state := filepath.Join(dir, "state")
	out, code := run(fakeRoot(t, tree580), "status", plan, "--state-dir", state, "-var", "driver_version=580.95.05")
	for _, want := range []string{"✓ nvidia_driver.host: driver 580.95.05 loaded, 2× NVIDIA RTX A6000", "gpu state", "ok (procfs)",
		"NVIDIA RTX A6000, 0000:c1:00.0, GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02, memory not visible without NVML"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status: exit %d, want 0 and %q in\n%s", code, want, out)
		}
	}
	out, code = run(fakeRoot(t, treeBare), "status", plan, "--state-dir", state, "-var", "driver_version=580.95.05")
	if code != 3 || !strings.Contains(out, "neither installer") {
		t.Errorf("status without a driver: exit %d, want 3\n%s", code, out)
	}
}
