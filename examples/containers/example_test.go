// Package containers_test applies the example container plan against a private Incus
// daemon with the agent's command line, then plans again and expects no changes, then
// destroys it (instance deleted, verified; the disk's host directory kept).
package containers_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/agent-dev/agent/internal/cli"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
)

func TestExamplePlanAppliesThenNoOp(t *testing.T) {
	d := incustest.Start(t)
	models := t.TempDir()
	if err := os.WriteFile(models+"/config.json", []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := d.InstanceName(t)
	state := t.TempDir()
	run := func(want int, cmd string) string {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli.Main([]string{cmd, "--state-dir", state, "-var", "incus_socket=" + d.Socket, "-var", "model_root=" + models, "-var", "container_name=" + name, "."}, &out, &errb)
		if code != want {
			t.Fatalf("agent %s: exit %d, want %d\n%s%s\n%s", cmd, code, want, out.String(), errb.String(), d.LogTail(10))
		}
		return out.String()
	}
	out := run(2, "plan")
	t.Logf("agent plan:\n%s", out)
	if !strings.Contains(out, "container.sglang") {
		t.Errorf("plan output does not name the container:\n%s", out)
	}
	t.Logf("agent apply:\n%s", run(0, "apply"))
	run(0, "plan")
	out = run(0, "status")
	t.Logf("agent status:\n%s", out)
	if !strings.Contains(out, "/models") {
		t.Errorf("status does not show the disk:\n%s", out)
	}

	// agent destroy: the instance is stopped and deleted, verified; the disk's host
	// directory is kept; a second destroy has nothing to do.
	out = run(0, "destroy")
	t.Logf("agent destroy:\n%s", out)
	if !strings.Contains(out, "✓ container.sglang: deleted and verified") {
		t.Errorf("destroy output:\n%s", out)
	}
	if _, _, err := d.Client.GetInstance(context.Background(), name); !incus.IsNotFound(err) {
		t.Errorf("instance %s after destroy: %v", name, err)
	}
	if _, err := os.Stat(models + "/config.json"); err != nil {
		t.Errorf("the disk's host directory after destroy: %v", err)
	}
	if out = run(0, "destroy"); !strings.Contains(out, "No changes") {
		t.Errorf("second destroy:\n%s", out)
	}
}
