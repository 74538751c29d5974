package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/resources"
)

// GPU faults (issue 37, docs/gpu.md "When a GPU fails"): under `agent run` the servers'
// watches poll the host's resources.HostFaults (one gpu.FaultWatch and its gpu.Book,
// one judgement per GPU, in the loop's memory); Check reads the judgement of the GPUs a server uses
// and decides, and the engine acts on the diff as on any other:
//   - a fault that asks for the application to be restarted (or an Xid naming one of the
//     server's processes: the driver reset its channel), newer than the generation's
//     launch, relaunches it once, reason gpu_fault, the line quoted;
//   - a GPU that needs the machine rebooted gets its servers relaunched once, then held
//     (no relaunch, status degraded "reboot required: …") until a reboot or NVML reading
//     the GPU healthy clears the judgement.
// `agent apply` polls nothing, so it never acts on a fault.

// gpuFaultIncident is the GPU fault a generation was relaunched for, kept in the record
// (and carried to the generations after it) with the boot it happened in: an agent that
// restarts reads the kernel log again and must not act twice on one fault.
type gpuFaultIncident struct {
	Boot       string     `json:"boot"`
	GPU        int        `json:"gpu"`
	PCIBusID   string     `json:"pci_bus_id"`
	Xid        int        `json:"xid,omitempty"`
	Kind       string     `json:"kind"`
	Seq        uint64     `json:"seq,omitempty"`
	At         time.Time  `json:"at"`
	Line       string     `json:"line,omitempty"`
	Action     gpu.Action `json:"action"`
	Generation int        `json:"generation"` // the generation it ended
	Explain    string     `json:"explain"`    // "GPU 1 (0000:41:00.0) fell off the bus (Xid 79 at 10:04:05)"
}

// same reports whether the incident is fault f of boot.
func (i *gpuFaultIncident) same(boot string, f gpu.Fault) bool {
	return i != nil && i.Boot == boot && i.Kind == f.Kind && i.Xid == f.Xid && i.Seq == f.Seq && i.At.Equal(f.At)
}

// gpusUsed are the indices of the GPUs the server uses: its CUDA_VISIBLE_DEVICES
// (indices or UUIDs), else those NVML lists its processes on.
func (s *Server) gpusUsed(devices []gpu.Device, rec *serverRecord) []int {
	var out []int
	if cvd := strings.TrimSpace(s.env["CUDA_VISIBLE_DEVICES"]); cvd != "" {
		for _, part := range strings.Split(cvd, ",") {
			part = strings.TrimSpace(part)
			if n, err := strconv.Atoi(part); err == nil {
				out = append(out, n)
				continue
			}
			for _, d := range devices {
				if d.UUID == part {
					out = append(out, d.Index)
				}
			}
		}
		return out
	}
	for _, d := range devices {
		for _, p := range d.Processes {
			if s.heldBy(rec, p.PID) {
				out = append(out, d.Index)
				break
			}
		}
	}
	return out
}

// gpuFaultNow is what the judgements of the server's GPUs ask of rec's generation: a
// fault to relaunch it for (act), or a reboot it waits for (held, the incident that
// relaunched it once already).
func (s *Server) gpuFaultNow(env *agent.Env, rec *serverRecord) (act *gpuFaultIncident, held *gpuFaultIncident) {
	h, ok := agent.Recall[*resources.HostFaults](env.Memory, resources.FaultsKey(s.host))
	if !ok {
		return nil, nil
	}
	book := h.Book()
	boot := book.Boot()
	for _, g := range s.gpusUsed(h.Devices(), rec) {
		j, ok := book.Of(g)
		if !ok {
			continue
		}
		if j.Standing == gpu.ActionReboot && j.Cause != nil {
			if p := rec.GPUFault; p != nil && p.Boot == boot && p.GPU == g && p.Action == gpu.ActionReboot {
				return nil, p
			}
			return incident(boot, j, *j.Cause, rec), nil
		}
		for i := len(j.Actionable) - 1; i >= 0; i-- { // the newest fault this generation saw
			f := j.Actionable[i]
			if f.At.Before(rec.LaunchedAt) || rec.GPUFault.same(boot, f) {
				break // older ones are older than the launch, or acted on with this one
			}
			if f.Action >= gpu.ActionRestartApp || gpu.EndsItsProcess(f) && s.heldBy(rec, f.PID) {
				return incident(boot, j, f, rec), nil
			}
		}
	}
	return nil, nil
}

func incident(boot string, j gpu.Judgement, f gpu.Fault, rec *serverRecord) *gpuFaultIncident {
	return &gpuFaultIncident{Boot: boot, GPU: j.GPU, PCIBusID: j.PCIBusID, Xid: f.Xid, Kind: f.Kind, Seq: f.Seq, At: f.At, Line: f.Line,
		Action: f.Action, Generation: rec.Generation, Explain: j.Name() + " " + gpu.Explain(f)}
}

// gpuFaultDiff is decide's answer to a GPU fault on the recorded generation (alive or
// not) that observe found, and whether there is one.
func (s *Server) gpuFaultDiff(o *observation) (*agent.Diff, bool) {
	if !o.has {
		return nil, false
	}
	rec, act, held := &o.rec, o.gpuAct, o.gpuHeld
	if held != nil {
		d := agent.NoChange()
		d.Warnings = append(d.Warnings, heldMessage(held))
		return d, true
	}
	if act == nil {
		return nil, false
	}
	r := *rec
	r.GPUFault = act
	quote := act.Line
	if quote == "" {
		quote = act.Explain
	}
	c := agent.Set("gpu", agent.Raw(quote), agent.Raw("a new generation"))
	c.Note = "restart: " + act.Explain
	switch act.Action {
	case gpu.ActionReboot:
		c.Note += "; one attempt, then held until the host reboots"
	}
	det := &serverDetail{prev: &r, stop: true}
	if act.Action == gpu.ActionResetGPU {
		det.reset = &gpuReset{index: act.GPU, bus: act.PCIBusID}
		c.Note += fmt.Sprintf("; stopped, verified, then nvidia-smi --gpu-reset -i %d (only when nothing else uses the GPU), then relaunched", act.GPU)
	}
	return &agent.Diff{
		Changes: []agent.Change{c.Because(agent.Restarts, agent.ReasonGPUFault)},
		Detail:  det,
		Record:  agent.SaveRecord(&r, fmt.Sprintf("generation %d (pid %d): %s: %s", rec.Generation, rec.PID, act.Explain, quote)),
	}, true
}

func heldMessage(i *gpuFaultIncident) string {
	return fmt.Sprintf("reboot required: %s; held after one relaunch (generation %d), not relaunched again until the host reboots", i.Explain, i.Generation)
}

// carryGPUFault keeps in a new generation's record the GPU fault of the one it replaces;
// a reset that failed makes it a reboot, for which this launch was the one attempt.
func carryGPUFault(r, prev *serverRecord, reset *gpuReset) {
	if prev == nil || prev.GPUFault == nil {
		return
	}
	i := *prev.GPUFault
	if reset != nil && reset.failed != "" {
		i.Action, i.Explain = gpu.ActionReboot, i.Explain+"; GPU reset not done: "+reset.failed
	}
	r.GPUFault = &i
}

// statusGPUFault shows the GPU fault the server was last relaunched for, and the reboot
// it waits for as a problem.
func (s *Server) statusGPUFault(field func(agent.Field), env *agent.Env, rec *serverRecord) []string {
	i := rec.GPUFault
	if i == nil {
		return nil
	}
	field(agent.TextField("gpu_fault", "GPU fault", fmt.Sprintf("generation %d relaunched: %s: %s", i.Generation, i.Explain, i.Line)))
	if _, held := s.gpuFaultNow(env, rec); held != nil {
		return []string{"reboot required: " + held.Explain}
	}
	return nil
}

// watchGPUFaults polls the host's fault watch while the server's watch runs, and calls
// fault when the judgement of one of its GPUs asks Check to act (a relaunch, not a hold).
func (s *Server) watchGPUFaults(ctx context.Context, env *agent.Env, rec *serverRecord, fault func()) {
	h := resources.FaultsOf(env, s.host)
	t := time.NewTicker(resources.FaultPoll)
	defer t.Stop()
	for {
		h.Poll(ctx, env)
		if act, _ := s.gpuFaultNow(env, rec); act != nil {
			fault()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Watch implements agent.Watcher: the server's process and probes (watchServer), and
// under them its GPUs' faults. A fault to act on ends the watch, so the loop runs Check.
func (s *Server) Watch(ctx context.Context, env *agent.Env) error {
	var rec serverRecord
	if has, err := env.State.Load(&rec); err != nil || !has || rec.Pending != nil || rec.PID <= 0 {
		return s.watchServer(ctx, env)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	faulted := make(chan struct{})
	go s.watchGPUFaults(ctx, env, &rec, func() { close(faulted); cancel() })
	err := s.watchServer(ctx, env)
	select {
	case <-faulted:
		return nil
	default:
		return err
	}
}
