package container

import (
	"context"
	"fmt"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
)

// Status reports the instance's live state: status, init PID, addresses, attached GPUs
// and disks.
func (k *Container) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	if k.Delete {
		return k.absentStatus(ctx, env)
	}
	k, rec, err := k.liveView(env)
	if err != nil {
		return nil, err
	}
	c := k.client(env)
	inst, member, err := getInstance(ctx, env.Memory, c, k.name)
	if incus.IsNotFound(err) {
		return &agent.Status{Healthy: false, Summary: "instance " + k.name + " does not exist"}, nil
	}
	if err != nil && member != "" && agent.IsUnavailable(err) {
		return &agent.Status{Summary: err.Error(), Fields: []agent.Field{agent.TextField("status", "status", "unknown"), agent.TextField(agent.MemberField, "member", member)}}, nil
	}
	if err != nil {
		return nil, err
	}
	st := &agent.Status{Fields: []agent.Field{agent.TextField("status", "status", inst.Status)}}
	if member := resources.InstanceMember(inst); member != "" {
		st.Fields = append(st.Fields, agent.TextField(agent.MemberField, "member", member))
		if err := resources.MemberOnline(ctx, env.Memory, c, member, k.name); err != nil {
			st.Fields[0] = agent.TextField("status", "status", "unknown") // the cluster's database answers for an offline member
			st.Summary = err.Error()
			return st, nil
		}
	}
	var addrs []string
	if inst.StatusCode == incus.StatusRunning {
		state, err := c.InstanceState(ctx, k.name)
		if err != nil {
			return nil, err
		}
		st.Fields = append(st.Fields, agent.NumberField("init_pid", "init_pid", state.Pid))
		if !state.StartedAt.IsZero() && state.StartedAt.Year() > 1970 {
			st.Fields = append(st.Fields, agent.TimeField("started_at", "started", state.StartedAt))
		}
		for _, ifname := range containerKeys(state.Network) {
			if ifname == "lo" {
				continue
			}
			for _, a := range state.Network[ifname].Addresses {
				if a.Scope == "global" {
					addrs = append(addrs, ifname+" "+a.Address)
				}
			}
		}
		if len(addrs) > 0 {
			st.Fields = append(st.Fields, agent.TextField("addresses", "addresses", strings.Join(addrs, ", ")))
		}
	}
	var gpus, disks []string
	for _, name := range containerKeys(inst.ExpandedDevices) {
		dev := inst.ExpandedDevices[name]
		switch dev["type"] {
		case "gpu":
			sel := renderIncusDevice(dev)
			gpus = append(gpus, name+" "+sel)
		case "disk":
			if dev["path"] == "/" {
				continue
			}
			src := dev["source"]
			if dev["pool"] != "" {
				src = dev["pool"] + "/" + src
			}
			ro := ""
			if dev["readonly"] == "true" {
				ro = " (ro)"
			}
			disks = append(disks, fmt.Sprintf("%s %s → %s%s", name, src, dev["path"], ro))
		}
	}
	if len(gpus) > 0 {
		st.Fields = append(st.Fields, agent.TextField("gpus", "gpus", strings.Join(gpus, "; ")))
	}
	if len(disks) > 0 {
		st.Fields = append(st.Fields, agent.TextField("disks", "disks", strings.Join(disks, "; ")))
	}
	if k.base != "" {
		st.Fields = append(st.Fields, agent.TextField("instance", "instance", k.name))
	}
	if rec.Retiring != "" {
		st.Fields = append(st.Fields, agent.TextField("retiring", "retiring", fmt.Sprintf("%s on %s (a migration: deleted once its dependents verify)", rec.Retiring, noneIfEmpty(rec.RetiringMember))))
	}
	if v := inst.ExpandedConfig["nvidia.runtime"]; v == "true" {
		st.Fields = append(st.Fields, agent.BoolField("nvidia_runtime", "nvidia_runtime", true))
	}
	if k.userspace != "" && inst.StatusCode == incus.StatusRunning {
		if have, err := k.userspaceVersion(ctx, c); err == nil {
			st.Fields = append(st.Fields, agent.TextField("nvidia_userspace", "nvidia_userspace", have).WithText(noneIfEmpty(have)))
		}
	}
	d, err := k.Check(ctx, env)
	switch {
	case err != nil:
		st.Summary = fmt.Sprintf("%s; %v", strings.ToLower(inst.Status), err)
	case d.Action != agent.NoOp:
		st.Summary = fmt.Sprintf("%s; differs from the plan (%s)", strings.ToLower(inst.Status), d.Action)
	default:
		st.Healthy = true
		st.Summary = strings.ToLower(inst.Status) + ", matches the plan"
	}
	return st, nil
}

// renderIncusDevice renders a device's options (without its type) for a diff: {pci = "…"}.
func renderIncusDevice(dev map[string]string) string {
	var parts []string
	for _, key := range containerKeys(dev) {
		if key == "type" && dev["type"] != "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s = %q", key, dev[key]))
	}
	typ := dev["type"]
	if len(parts) == 0 {
		return typ + " {}"
	}
	return typ + " {" + strings.Join(parts, ", ") + "}"
}

var _ agent.Watcher = (*Container)(nil)

// Watch returns once the cluster member holding the instance is no longer Online as the
// cluster reports it (a member whose incusd hangs or died: Offline once its heartbeats
// are missed), so that `agent run` observes the container again within seconds and its
// status says what the cluster says, instead of "running, matches the plan" until the
// next resync (issue 27: 36 s after the cluster had marked the member Offline). An
// instance that is not on a cluster member has nothing to watch here.
func (k *Container) Watch(ctx context.Context, env *agent.Env) error {
	if k.Delete {
		return agent.ErrNothingToWatch
	}
	k, _, err := k.liveView(env)
	if err != nil {
		return err
	}
	return resources.WatchMember(ctx, env, k.client(env), k.name)
}
