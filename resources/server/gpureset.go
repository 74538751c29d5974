package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
)

// gpuReset is a GPU to reset before the relaunch: the catalog's reset-gpu (docs/gpu.md,
// "When a GPU fails").
type gpuReset struct {
	index int
	bus   string
	// failed is set by Apply when the reset could not be done or did not help: the GPU is
	// then judged as needing a reboot, and the relaunch that follows is the one attempt.
	failed string
}

// resetGPU resets the GPU of r, the server's own generation already stopped (verified):
// the agent's other servers on it are stopped (verified, the driver's hook), the reset
// runs only when no process is left on the GPU (NVML must say so: without NVML the
// processes are unknown and nothing is reset), then the GPU is read again. Whatever
// fails makes the GPU's judgement a reboot (HostFaults.Escalate), recorded in r.failed.
func (s *Server) resetGPU(ctx context.Context, env *agent.Env, r *gpuReset) {
	h := resources.FaultsOf(env, s.host)
	fail := func(why string) {
		r.failed = why
		h.Escalate(env, r.index, "GPU reset not done: "+why)
		env.Log.Error("GPU reset not done: the GPU needs a reboot", "gpu", r.index, "pci", r.bus, "why", why)
	}
	obs := s.host.GPU
	if obs == nil {
		obs = gpu.Default(s.host.Root)
	}
	procs, err := gpuProcesses(ctx, obs, r.index)
	if err != nil {
		fail(err.Error())
		return
	}
	if len(procs) > 0 && s.host.StopGPUServers != nil {
		var records *state.View
		if env.State != nil {
			records = env.State.Others()
		}
		reason := fmt.Sprintf("%s: GPU %d (%s) is reset", env.Addr, r.index, r.bus)
		if err := s.host.StopGPUServers.StopGPUServers(ctx, records, procs, reason); err != nil {
			fail("stop the agent's servers on it: " + err.Error())
			return
		}
		if procs, err = gpuProcesses(ctx, obs, r.index); err != nil {
			fail(err.Error())
			return
		}
	}
	if len(procs) > 0 {
		fail(fmt.Sprintf("pid %s still uses it, which the agent did not start", joinPIDs(procs)))
		return
	}
	run := s.host.Run
	if run == nil {
		run = resources.ExecRunner{}
	}
	env.Log.Warn("resetting the GPU", "gpu", r.index, "pci", r.bus)
	if out, err := run.Run(ctx, resources.Command{Name: "nvidia-smi", Args: []string{"--gpu-reset", "-i", strconv.Itoa(r.index)}}); err != nil {
		fail(fmt.Sprintf("nvidia-smi --gpu-reset -i %d: %v: %s", r.index, err, resources.TailLines(out, 5)))
		return
	}
	if why := h.Healthy(ctx, env, r.index); why != "" {
		fail("after the reset: " + why)
		return
	}
	env.Log.Info("GPU reset and healthy again", "gpu", r.index, "pci", r.bus)
}

// gpuProcesses are the PIDs NVML lists on GPU index; an error when it cannot list them.
func gpuProcesses(ctx context.Context, obs gpu.Observer, index int) ([]int, error) {
	info, err := obs.Observe(ctx)
	if err != nil {
		return nil, err
	}
	if info.State != gpu.StateOK || info.Source != gpu.SourceNVML {
		return nil, fmt.Errorf("the processes on the GPU cannot be listed (%s, %s): no reset without proof that nothing else uses it", info.State, info.Source)
	}
	for _, d := range info.GPUs {
		if d.Index == index {
			var pids []int
			for _, p := range d.Processes {
				pids = append(pids, p.PID)
			}
			return pids, nil
		}
	}
	return nil, fmt.Errorf("GPU %d is not seen", index)
}

func joinPIDs(pids []int) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ", ")
}
