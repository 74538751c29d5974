package driver

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// A GPU fallen off the bus (Xid 79, judged by the fault watch the servers poll under
// agent run) asks for a reboot: with reboot = "allowed" the driver reboots the host as it
// does for a driver change, once per boot, through the command runner; with "never" it
// says so and runs nothing; without a fault watch (agent apply) nothing is judged.
func TestDriverRebootsForAGPUFault(t *testing.T) {
	t.Parallel()
	for _, allowed := range []bool{true, false} {
		run := &fakeRunner{}
		h := driverHost(t, tree580, run)
		extra := "  reboot = \"never\"\n"
		if allowed {
			extra = "  reboot = \"allowed\"\n"
		}
		src := serveInstaller(t, h.Root, false, 0).plan(extra)
		mem := agent.NewMemory()
		e := restest.Engine(t, t.TempDir(), src, []agent.Kind{DriverKind(h)}, restest.OpenStore(t, filepath.Join(h.StateDir, "state")), agent.Options{Memory: mem})
		ctx := context.Background()
		if st := oneStep(t, e.Plan(ctx)); st.Diff.Action != agent.NoOp {
			t.Fatalf("no fault yet: %+v", st.Diff)
		}

		if err := os.MkdirAll(filepath.Join(h.Root, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(h.Root, "dev", "kmsg"), []byte("4,7,1000,-;NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		env := &agent.Env{Memory: mem, Now: time.Now, Log: slog.New(slog.DiscardHandler)}
		hf := resources.FaultsOf(env, h)
		hf.Poll(ctx, env)

		st := oneStep(t, e.Apply(ctx, nil))
		if !allowed {
			if st.Err != nil || st.Diff.Action != agent.NoOp || !hasString(st.Diff.Warnings, `reboot required: GPU 1 (0000:c1:00.0) fell off the bus (Xid 79 at `) ||
				!hasString(st.Diff.Warnings, `(reboot = "never": reboot the host to bring the GPU back)`) {
				t.Fatalf("reboot = never: %v %+v", st.Err, st.Diff)
			}
			if got := run.ran(); len(got) != 0 {
				t.Errorf("reboot = never ran %q", got)
			}
			// Status: each GPU's health and last faults, for people and typed.
			st := oneStep(t, e.Status(ctx)).Status
			fields := map[string]string{}
			for _, f := range st.Fields {
				fields[f.Key] = f.Text
			}
			if got := fields["gpu_health[1]"]; !strings.HasPrefix(got, "reboot required: fell off the bus (Xid 79 at ") {
				t.Errorf("gpu_health[1] = %q", got)
			}
			if got := fields["gpu_health[0]"]; got != "healthy" {
				t.Errorf("gpu_health[0] = %q", got)
			}
			if st.Healthy || len(st.Faults) != 1 {
				t.Fatalf("status: %+v", st)
			}
			if f := st.Faults[0]; f.Subject != "gpu[1]" || f.Device != "0000:c1:00.0" || f.Kind != "xid" || f.Code != 79 || f.Action != "reboot" ||
				!strings.HasPrefix(f.Line, "NVRM: Xid (PCI:0000:c1:00): 79") {
				t.Errorf("fault: %+v", f)
			}
			continue
		}
		if st.Err != nil || !st.Applied {
			t.Fatalf("apply: %v %+v", st.Err, st.Diff)
		}
		if got := run.ran(); !slices.Equal(got, []string{"systemctl reboot"}) {
			t.Fatalf("commands %q, want the reboot", got)
		}
		oneStep(t, e.Apply(ctx, nil))
		if got := run.ran(); len(got) != 1 {
			t.Fatalf("commands %q: a second reboot in the same boot", got)
		}
	}
}
