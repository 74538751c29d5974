package daemon

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/registry"
)

// nvmlView is the fake host's GPUs as NVML would show them: procfs's GPUs, and on each the
// live processes whose CUDA_VISIBLE_DEVICES names it (the fake servers under home), plus
// the foreign ones the test adds.
type nvmlView struct {
	procfs  gpu.ProcFS
	home    string
	mu      sync.Mutex
	foreign map[int][]int
}

func (v *nvmlView) Observe(ctx context.Context) (gpu.Info, error) {
	info, err := v.procfs.Observe(ctx)
	if err != nil {
		return info, err
	}
	info.Source = gpu.SourceNVML
	v.mu.Lock()
	defer v.mu.Unlock()
	for pid := range testbin.Servers(v.home) {
		env, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		stat, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); i < 0 || strings.HasPrefix(string(stat[i+1:]), " Z") {
			continue // a zombie holds no GPU
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if n, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES="); ok {
				idx, _ := strconv.Atoi(n)
				info.GPUs[idx].Processes = append(info.GPUs[idx].Processes, gpu.Process{PID: pid, UsedMemory: 1 << 30})
			}
		}
	}
	for idx, pids := range v.foreign {
		for _, pid := range pids {
			info.GPUs[idx].Processes = append(info.GPUs[idx].Processes, gpu.Process{PID: pid, UsedMemory: 1 << 30})
		}
	}
	return info, nil
}

// resetRunner records the host commands (nvidia-smi --gpu-reset) and runs none.
type resetRunner struct {
	mu   sync.Mutex
	cmds []string
}

func (r *resetRunner) Run(_ context.Context, c resources.Command) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmds = append(r.cmds, c.String())
	return nil, nil
}

func (r *resetRunner) ran() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.cmds)
}

// Issue 37, reset-the-GPU: an Xid whose catalog action is a GPU reset (119, GSP RPC
// timeout) stops the GPU's server (verified), runs nvidia-smi --gpu-reset -i N through the
// command runner when nothing else uses the GPU, and relaunches it; with a process the
// agent did not start on the GPU, nothing is reset: the GPU is judged as needing a reboot,
// its server gets its one relaunch and is then held.
func TestGPUResetUnderAgentRun(t *testing.T) {
	hostRoot, kmsg := gpuHostRoot(t)
	fake, root := fakeRoot(t)
	view := &nvmlView{procfs: gpu.ProcFS{Root: hostRoot}, home: root, foreign: map[int][]int{}}
	run := &resetRunner{}
	vars := []string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t)), "port2=" + strconv.Itoa(testbin.FreePort(t))}
	stateDir := ""
	base, logs := runReal(t, gpuFaultPlan, vars, func(c *Config) {
		stateDir = c.StateDir
		c.Interval = 2 * time.Second
		c.Kinds = registry.KindsFor(resources.Machine{Root: hostRoot, GPU: view, Run: run})
	})
	waitLong(t, "both servers verified", 90*time.Second, func() bool {
		a, b := readFault(t, stateDir, "gpu0"), readFault(t, stateDir, "gpu1")
		return a.Generation == 1 && !a.VerifiedAt.IsZero() && b.Generation == 1 && !b.VerifiedAt.IsZero()
	})
	g1 := readFault(t, stateDir, "gpu1")

	kmsg(20, "NVRM: Xid (PCI:0000:01:00): 119, pid=5220, name=cache_mgr_main, Timeout after 45s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) sequence 3661611 (0x208f1105 0x8).")
	waitLong(t, "GPU 0 reset and its server relaunched", 60*time.Second, func() bool {
		r := readFault(t, stateDir, "gpu0")
		return r.Generation == 2 && !r.VerifiedAt.IsZero()
	})
	if got := run.ran(); !slices.Equal(got, []string{"nvidia-smi --gpu-reset -i 0"}) {
		t.Fatalf("host commands %q, want the reset of GPU 0", got)
	}
	if r := readFault(t, stateDir, "gpu0"); r.GPUFault == nil || r.GPUFault.Action != "reset-gpu" || r.GPUFault.Xid != 119 {
		t.Errorf("GPU 0's record: %+v", r.GPUFault)
	}
	if b := readFault(t, stateDir, "gpu1"); b.Generation != 1 || b.PID != g1.PID {
		t.Errorf("GPU 1's server moved with GPU 0's reset: %+v", b)
	}
	if !strings.Contains(logs.String(), "GPU reset and healthy again") {
		t.Errorf("the log does not say the reset worked")
	}

	// A process the agent did not start uses GPU 1: no reset, a reboot is required.
	foreign := exec.Command("sleep", "300")
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { foreign.Process.Kill(); foreign.Wait() })
	view.mu.Lock()
	view.foreign[1] = []int{foreign.Process.Pid}
	view.mu.Unlock()
	kmsg(21, "NVRM: Xid (PCI:0000:41:00): 119, pid=5221, name=cache_mgr_main, Timeout after 45s of waiting for RPC response from GPU1 GSP!")
	waitLong(t, "GPU 1's server relaunched once", 60*time.Second, func() bool {
		r := readFault(t, stateDir, "gpu1")
		return r.Generation == 2 && !r.VerifiedAt.IsZero()
	})
	want := "reboot required: GPU 1 (0000:41:00.0) raised GSP_RPC_TIMEOUT (Xid 119 at "
	waitLong(t, "status says reboot required", 30*time.Second, func() bool {
		r := statusOf(t, base, "server.gpu1")
		return r.Status != nil && strings.Contains(r.Status.Summary, want) && strings.Contains(r.Status.Summary, "pid "+strconv.Itoa(foreign.Process.Pid)+" still uses it")
	})
	if got := run.ran(); len(got) != 1 {
		t.Errorf("host commands %q: GPU 1 was reset although another process uses it", got)
	}
	time.Sleep(6 * time.Second) // three resyncs
	if r := readFault(t, stateDir, "gpu1"); r.Generation != 2 || r.GPUFault == nil || r.GPUFault.Action != "reboot" {
		t.Errorf("GPU 1's server after the refused reset: %+v", r)
	}
}
