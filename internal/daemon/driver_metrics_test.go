package daemon

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/registry"
)

// twoGPUs is what NVML would report for a host with two 48 GiB GPUs, the second with a
// server on it.
type twoGPUs struct{}

func (twoGPUs) Observe(context.Context) (gpu.Info, error) {
	return gpu.Info{State: gpu.StateOK, Source: gpu.SourceNVML, DriverVersion: "580.95.05", CUDADriverVersion: "13.0", GPUs: []gpu.Device{
		{Index: 0, Name: "NVIDIA RTX A6000", UUID: "GPU-6a2e5a62-1f1c-5c3e-9f0a-2d7b8e4c1a01", PCIBusID: "0000:01:00.0", MemoryTotal: 48 << 30, MemoryFree: 48 << 30},
		{Index: 1, Name: "NVIDIA RTX A6000", UUID: "GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02", PCIBusID: "0000:c1:00.0", MemoryTotal: 48 << 30, MemoryUsed: 40 << 30, MemoryFree: 8 << 30,
			Processes: []gpu.Process{{PID: 4242, UsedMemory: 40 << 30}}},
	}}, nil
}

type noCommands struct{}

func (noCommands) Run(_ context.Context, c resources.Command) ([]byte, error) {
	return nil, errors.New(c.Name + ": no host commands in this test")
}

// Issue 29's leftover: under agent run the driver's per-GPU figures are one metric name
// each, with the GPU's index and UUID as labels, so a query can aggregate over GPUs
// (sum by (instance) (agent_nvidia_driver_gpu_memory_used_bytes)); the old names with the
// index in them are still there for one release (docs/service.md, deprecated).
func TestDriverGPUSeriesInMetrics(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	for name, body := range map[string]string{
		"proc/driver/nvidia/version":                         "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025\n",
		"proc/sys/kernel/random/boot_id":                     "5d1f2a3c-0000-4000-8000-000000000001\n",
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05": "",
		"proc/4242/cmdline":                                  "python3\x00-m\x00sglang.launch_server\x00",
		"proc/modules":                                       "nvidia 14376960 1 nvidia_uvm, Live 0x0000000000000000\n",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libnvidia-ml.so.580.95.05", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	h := resources.Machine{Root: root, GPU: twoGPUs{}, Proc: proc.FS{Root: filepath.Join(root, "proc")}, Run: noCommands{}, StateDir: t.TempDir()}
	base, _ := runReal(t, `nvidia_driver "host" {
  version = "580.95.05"
}
`, nil, func(c *Config) { c.Kinds = registry.KindsFor(h) })

	const (
		gpu0 = `gpu="0",kind="nvidia_driver",name="host",resource="nvidia_driver.host",uuid="GPU-6a2e5a62-1f1c-5c3e-9f0a-2d7b8e4c1a01"`
		gpu1 = `gpu="1",kind="nvidia_driver",name="host",resource="nvidia_driver.host",uuid="GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02"`
	)
	want := []string{
		"# TYPE agent_nvidia_driver_gpu_memory_used_bytes gauge",
		"agent_nvidia_driver_gpu_memory_used_bytes{" + gpu0 + "} 0",
		"agent_nvidia_driver_gpu_memory_used_bytes{" + gpu1 + "} 4.294967296e+10",
		"agent_nvidia_driver_gpu_memory_total_bytes{" + gpu0 + "} 5.1539607552e+10",
		"agent_nvidia_driver_gpu_memory_total_bytes{" + gpu1 + "} 5.1539607552e+10",
		"agent_nvidia_driver_gpu_processes{" + gpu0 + "} 0",
		"agent_nvidia_driver_gpu_processes{" + gpu1 + "} 1",
		// Deprecated, kept for one release.
		`agent_nvidia_driver_gpu1_memory_used_bytes{kind="nvidia_driver",name="host",resource="nvidia_driver.host"} 4.294967296e+10`,
	}
	var body string
	waitLong(t, "the driver's GPU series in /metrics", 30*time.Second, func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %s\n%s", resp.Status, b)
		}
		body = string(b)
		return strings.Contains(body, "agent_nvidia_driver_gpus{")
	})
	lines := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		lines[l] = true
	}
	for _, w := range want {
		if !lines[w] {
			t.Errorf("/metrics lacks the line\n%s", w)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	series := map[string]string{}
	for _, s := range statusOf(t, base, "nvidia_driver.host").Status.Series {
		series[s.Name+"/"+s.Labels["gpu"]] = s.Labels["uuid"]
	}
	if len(series) != 6 || series["gpu_processes/1"] != "GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02" {
		t.Errorf("/status series %v, want 3 for each GPU with its UUID", series)
	}
}
