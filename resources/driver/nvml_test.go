//go:build cgo

package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
)

// Issue 6 points 3 and 4: status over go-nvml's simulated DGX H200 (with what the
// simulator lacks set here: PCI bus ids, persistence mode, compute processes) shows each
// GPU's memory and the processes using it, by PID and command line.
func TestDriverStatusDGXH200(t *testing.T) {
	t.Parallel()
	s := dgxh200.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		var busID [32]int8
		for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0x18+i) {
			busID[j] = int8(c)
		}
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{BusId: busID}, nvml.SUCCESS
		}
		dev.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
		used := uint64(0)
		var procs []nvml.ProcessInfo
		if i < 2 {
			used = 70 << 30
			procs = []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 70 << 30}}
		}
		dev.MemoryInfo = nvml.Memory{Total: dev.MemoryInfo.Total, Used: used, Free: dev.MemoryInfo.Total - used}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return procs, nvml.SUCCESS }
	}
	const version = "550.54.15" // what the simulator reports
	root := fakeRoot(t, strings.ReplaceAll(tree580, "580.95.05", version))
	procRoot := t.TempDir()
	os.MkdirAll(filepath.Join(procRoot, "4242"), 0o755)
	os.WriteFile(filepath.Join(procRoot, "4242", "cmdline"), []byte("python3\x00-m\x00sglang.launch_server\x00--tp-size\x002\x00"), 0o644)

	h := resources.Machine{Root: root, GPU: gpu.NewNVML(s), Proc: proc.FS{Root: procRoot}, Run: &fakeRunner{}}
	d := bindForTest(t, h, `nvidia_driver "host" {
  version          = "550.54.15"
  persistence_mode = true
}`)
	st, err := d.Status(context.Background(), &agent.Env{Log: discardLog()})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Healthy || st.Summary != "driver 550.54.15 loaded, 8× NVIDIA H200 141GB HBM3e" {
		t.Errorf("summary %q (healthy %v)", st.Summary, st.Healthy)
	}
	for name, want := range map[string]string{
		"gpu state":       "ok (nvml), CUDA 12.4",
		"gpu 0":           "NVIDIA H200 141GB HBM3e, 0000:18:00.0, GPU-",
		"gpu 1":           "memory 70.0 GiB used of 141.0 GiB, 71.0 GiB free, persistence mode on",
		"gpu 1 processes": "pid 4242 (python3 -m sglang.launch_server --tp-size 2) 70.0 GiB",
		"gpu 7":           "memory 0 B used of 141.0 GiB, 141.0 GiB free",
		"installed":       "550.54.15 (/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 → libnvidia-ml.so.550.54.15)",
		"loaded":          "550.54.15 (open kernel module)",
	} {
		if got := fieldValue(st, name); !strings.Contains(got, want) {
			t.Errorf("restest.Field %q = %q, want it to contain %q", name, got, want)
		}
	}
	if fieldValue(st, "gpu 2 processes") != "" {
		t.Errorf("gpu 2 lists processes: %+v", st.Fields)
	}
	// The same facts as numbers, for agent run's /metrics (gpu1_… deprecated, kept one release).
	for k, want := range map[string]float64{"gpus": 8, "gpu1_memory_used_bytes": 70 << 30, "gpu1_processes": 1, "gpu2_processes": 0, "reboot_required": 0} {
		if got, ok := st.Metrics[k]; !ok || got != want {
			t.Errorf("Metrics[%s] = %v (present %v), want %v", k, got, ok, want)
		}
	}
	// Issue 29's leftover: per GPU, one name with the index and UUID as labels.
	uuidOf := map[string]string{}
	got := map[string]float64{}
	for _, x := range st.Series {
		if len(x.Labels) != 2 || !strings.HasPrefix(x.Labels["uuid"], "GPU-") || x.Labels["gpu"] == "" {
			t.Errorf("series %+v: want the labels gpu and uuid", x)
		}
		uuidOf[x.Labels["gpu"]] = x.Labels["uuid"]
		got[x.Name+"{gpu="+x.Labels["gpu"]+"}"] = x.Value
	}
	if len(st.Series) != 3*8 {
		t.Errorf("%d series, want 3 for each of 8 GPUs: %+v", len(st.Series), st.Series)
	}
	for i, d := range s.Devices {
		if u, _ := d.GetUUID(); uuidOf[fmt.Sprint(i)] != u {
			t.Errorf("GPU %d's series have uuid %q, want %q", i, uuidOf[fmt.Sprint(i)], u)
		}
	}
	total := float64(s.Devices[7].(*server.Device).MemoryInfo.Total)
	for k, want := range map[string]float64{
		"gpu_memory_used_bytes{gpu=0}": 70 << 30, "gpu_memory_used_bytes{gpu=7}": 0,
		"gpu_memory_total_bytes{gpu=7}": total, "gpu_processes{gpu=1}": 1, "gpu_processes{gpu=2}": 0,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("series %s = %v (present %v), want %v", k, v, ok, want)
		}
	}
}

// Without NVML (the procfs fallback) memory and processes are not known: the GPUs have
// no series rather than zeros a dashboard would read as idle.
func TestDriverStatusSeriesWithoutNVML(t *testing.T) {
	t.Parallel()
	info := gpu.Info{State: gpu.StateOK, Source: gpu.SourceProcFS, GPUs: []gpu.Device{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}}
	if s := gpuSeries(info); len(s) != 0 {
		t.Errorf("procfs GPUs have series %+v, want none", s)
	}
	info.Source = gpu.SourceNVML
	info.GPUs[1].MemoryTotal, info.GPUs[1].MemoryUsed = 48<<30, 1<<30
	want := []agent.Series{
		{Name: "gpu_processes", Labels: map[string]string{"gpu": "0", "uuid": "GPU-a"}},
		{Name: "gpu_memory_used_bytes", Labels: map[string]string{"gpu": "1", "uuid": "GPU-b"}, Value: 1 << 30},
		{Name: "gpu_memory_total_bytes", Labels: map[string]string{"gpu": "1", "uuid": "GPU-b"}, Value: 48 << 30},
		{Name: "gpu_processes", Labels: map[string]string{"gpu": "1", "uuid": "GPU-b"}},
	}
	if s := gpuSeries(info); !reflect.DeepEqual(s, want) {
		t.Errorf("series\n%+v\nwant\n%+v", s, want)
	}
}
