package driver

import (
	"fmt"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/resources"
)

// statusGPUFaults adds each GPU's health and last faults (docs/gpu.md, "When a GPU
// fails") to the driver's status: fields for people (gpu_health[N], gpu_faults[N]) and the
// typed list (Status.Faults). They come from the fault watch `agent run` polls: without
// it (`agent status` with no agent running) the GPUs' faults are not known and nothing
// is added.
func (d *Driver) statusGPUFaults(add func(agent.Field), st *agent.Status, env *agent.Env, gpus []gpu.Device) {
	h, ok := agent.Recall[*resources.HostFaults](env.Memory, resources.FaultsKey(d.host))
	if !ok {
		return
	}
	judged := map[int]gpu.Judgement{}
	for _, j := range h.Book().All() {
		judged[j.GPU] = j
	}
	for _, g := range gpus {
		j := judged[g.Index]
		add(agent.TextField(fmt.Sprintf("gpu_health[%d]", g.Index), fmt.Sprintf("gpu %d health", g.Index), healthText(j)))
		if len(j.Last) == 0 {
			continue
		}
		var last []string
		for _, f := range j.Last[max(0, len(j.Last)-3):] {
			last = append(last, gpu.Explain(f))
		}
		add(agent.TextField(fmt.Sprintf("gpu_faults[%d]", g.Index), fmt.Sprintf("gpu %d faults", g.Index), strings.Join(last, "; ")))
		for _, f := range j.Last {
			st.Faults = append(st.Faults, agent.Fault{At: f.At.UTC(), Subject: fmt.Sprintf("gpu[%d]", g.Index), Device: f.PCIBusID, Kind: f.Kind,
				Code: f.Xid, Action: f.Action.String(), Text: f.Text, Line: f.Line})
		}
	}
}

// healthText is a GPU's judgement for people.
func healthText(j gpu.Judgement) string {
	switch {
	case j.Standing == gpu.ActionReboot && j.Cause != nil:
		return "reboot required: " + gpu.Explain(*j.Cause)
	case j.Standing == gpu.ActionResetGPU && j.Cause != nil:
		return "reset required: " + gpu.Explain(*j.Cause)
	case len(j.Last) > 0:
		return "healthy; last fault: " + gpu.Explain(j.Last[len(j.Last)-1])
	}
	return "healthy"
}
