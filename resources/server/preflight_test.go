package server

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// staticGPU is an NVML view that never changes.
type staticGPU struct{ info gpu.Info }

func (g staticGPU) Observe(context.Context) (gpu.Info, error) { return g.info, nil }

func twoA6000(free0, free1 uint64) gpu.Info {
	const total = 48 << 30
	return gpu.Info{State: gpu.StateOK, Source: gpu.SourceNVML, GPUs: []gpu.Device{
		{Index: 0, Name: "NVIDIA RTX A6000", MemoryTotal: total, MemoryFree: free0, MemoryUsed: total - free0},
		{Index: 1, Name: "NVIDIA RTX A6000", MemoryTotal: total, MemoryFree: free1, MemoryUsed: total - free1},
	}}
}

func TestServerPreflight(t *testing.T) {
	t.Parallel()
	models := t.TempDir()
	// 52 GiB of BF16 weights, as sparse files: their size is what counts, not their bytes.
	for _, n := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
		f, err := os.Create(filepath.Join(models, n))
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(26 << 30)
		f.Close()
	}
	tests := []struct {
		name, mode string
		info       gpu.Info
		wantErr    string
		wantWarn   string
	}{
		{"fits", "warn", twoA6000(47<<30, 47<<30), "", ""},
		{"warns", "warn", twoA6000(20<<30, 47<<30), "", "preflight: "},
		{"enforced", "enforce", twoA6000(20<<30, 47<<30), `preflight = "enforce": not launching`, ""},
		{"off", "off", twoA6000(1<<30, 1<<30), "", ""},
		{"no GPU says nothing", "enforce", gpu.Info{State: gpu.StateNoLibrary}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			src := `server "qwen" {
  command = ["/bin/true"]
  flags = {
    "model-path"          = "` + models + `"
    "tp-size"             = 2
    "mem-fraction-static" = 0.85
    "port"                = 1
  }
  env       = { CUDA_VISIBLE_DEVICES = "0,1" }
  log_dir   = "` + dir + `/logs"
  preflight = "` + tt.mode + `"
}
`
			kinds := []agent.Kind{ServerKind(resources.Machine{GPU: staticGPU{tt.info}})}
			e := restest.Engine(t, dir, src, kinds, restest.OpenStore(t, filepath.Join(dir, "state")), agent.Options{})
			st := e.Plan(context.Background()).Steps[0]
			if tt.wantErr != "" {
				if st.Err == nil || !strings.Contains(st.Err.Error(), tt.wantErr) || !strings.Contains(st.Err.Error(), "GiB") {
					t.Fatalf("err = %v, want %q with the numbers", st.Err, tt.wantErr)
				}
				return
			}
			if st.Err != nil {
				t.Fatal(st.Err)
			}
			warn := strings.Join(st.Diff.Warnings, "\n")
			if tt.wantWarn == "" && strings.Contains(warn, "preflight") {
				t.Errorf("unexpected warning: %s", warn)
			}
			t.Logf("warnings: %s", warn)
			if tt.wantWarn != "" && (!strings.Contains(warn, tt.wantWarn) || !strings.Contains(warn, "GiB")) {
				t.Errorf("warnings = %q, want %q with the numbers", warn, tt.wantWarn)
			}
		})
	}
}

// Point 4, GPU memory: a relaunch of a running server whose new generation would not fit
// the GPUs (even with the running one's memory freed) does not stop it, also under the
// default preflight = "warn"; a first launch only warns.
func TestServerRelaunchThatWouldNotFitLeavesTheServerRunning(t *testing.T) {
	t.Parallel()
	h := newSrvState(t)
	models := filepath.Join(h.dir, "models")
	os.Mkdir(models, 0o755)
	f, err := os.Create(filepath.Join(models, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(52 << 30) // sparse: its size is what counts
	f.Close()
	port := srvFreePort(t)
	src := `variable "mem" {}
server "qwen" {
  command = ["` + fakeSGLang(t) + `"]
  flags = {
    "model-path"          = "` + models + `"
    "tp-size"             = 2
    "mem-fraction-static" = var.mem
    "port"                = ` + strconv.Itoa(port) + `
  }
  env     = { CUDA_VISIBLE_DEVICES = "0,1", FAKE_SGLANG_DECODE_INTERVAL = "0" }
  ready {
    http    = "/health"
    timeout = "15s"
    settle  = "0s"
  }
  stop { timeout = "1s" }
  log_dir = "` + h.dir + `/logs"
}
`
	apply := func(info gpu.Info, mem string) *agent.Step {
		kinds := kindsFor(resources.Machine{GPU: staticGPU{info}})
		return restest.Engine(t, h.dir, src, kinds, h.store, agent.Options{}, "mem="+mem).Apply(context.Background(), nil).Steps[0]
	}
	mustOK(t, apply(twoA6000(47<<30, 47<<30), "0.85"))
	first := h.record()
	st := apply(twoA6000(20<<30, 47<<30), "0.8")
	if st.Err == nil || !strings.Contains(st.Err.Error(), "not stopping generation 1") || !strings.Contains(st.Err.Error(), "would not fit the GPUs") {
		t.Fatalf("apply: %v", st.Err)
	}
	if r := h.record(); r.id() != first.id() || !alive(first.id()) {
		t.Fatalf("the running server was stopped for a launch that would not fit: %+v", r)
	}
}
