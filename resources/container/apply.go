package container

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
)

// Apply creates, updates, restarts or replaces the instance as Check decided.
func (k *Container) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) error {
	det, ok := d.Detail.(*containerDetail)
	if !ok {
		return fmt.Errorf("internal error: container detail is %T", d.Detail)
	}
	if k.Delete {
		return k.applyAbsent(ctx, env, det)
	}
	k, _, err := k.liveView(env)
	if err != nil {
		return err
	}
	c := k.client(env)
	switch {
	case det.move:
		return k.applyMove(ctx, c, env, det)
	case det.migrate:
		return k.applyMigrate(ctx, c, env, det)
	}
	logf := func(msg string, args ...any) {
		if env != nil && env.Log != nil {
			env.Log.Info(msg, args...)
		}
	}
	switch {
	case det.replace:
		logf("replacing instance", "instance", k.name)
		if err := k.stopAndDelete(ctx, c, env); err != nil {
			return err
		}
		fallthrough
	case det.create:
		if err := k.saveIntent(env, det); err != nil {
			return err
		}
		if err := c.CreateInstance(ctx, k.post(det.fingerprint)); err != nil {
			return err
		}
		det.uuid = ""
		if inst, _, err := c.GetInstance(ctx, k.name); err == nil {
			det.uuid = inst.Config["volatile.uuid"]
		}
		if err := k.save(env, det); err != nil {
			return err
		}
		if k.running {
			if err := k.start(ctx, c); err != nil {
				return err
			}
		}
		return k.verifyUserspace(ctx, c, env)
	}

	if det.restart || det.stop {
		if err := k.stop(ctx, c, env); err != nil {
			return err
		}
	}
	if det.put {
		if err := k.saveIntent(env, det); err != nil {
			return err
		}
		if err := k.put(ctx, c, det); err != nil {
			return err
		}
	}
	if err := k.save(env, det); err != nil {
		return err
	}
	if det.restart || det.start {
		if err := k.start(ctx, c); err != nil {
			return err
		}
		// Check could not probe a stopped instance, and a restart can change what the
		// probe sees: probe now, and install when an installer is declared.
		return k.verifyUserspace(ctx, c, env)
	}
	if det.installUserspace {
		return k.installUserspace(ctx, c, env)
	}
	if det.userspaceErr != "" {
		return errors.New(det.userspaceErr)
	}
	return nil
}

// post is the creation request.
func (k *Container) post(fingerprint string) incus.InstancesPost {
	devs := make(map[string]map[string]string, len(k.devices))
	for n, dev := range k.devices {
		devs[n] = maps.Clone(dev)
	}
	return incus.InstancesPost{
		Name:   k.name,
		Type:   k.itype,
		Source: incus.InstanceSource{Fingerprint: fingerprint},
		Target: k.target,
		InstancePut: incus.InstancePut{
			Config:      maps.Clone(k.config),
			Devices:     devs,
			Profiles:    slices.Clone(k.profiles),
			Description: resources.Deref(k.description),
		},
	}
}

// put changes the instance in place: GET, change only what the plan manages, PUT with
// the ETag. Everything else (volatile.* keys, profiles when unmanaged, other devices)
// goes back exactly as read. A concurrent change (412) is retried on fresh data: the
// changes are the plan's values, not derived from the stale read.
func (k *Container) put(ctx context.Context, c *incus.Client, det *containerDetail) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var inst *incus.Instance
		var etag string
		inst, etag, err = c.GetInstance(ctx, k.name)
		if err != nil {
			return err
		}
		put := inst.InstancePut
		if put.Config == nil {
			put.Config = map[string]string{}
		}
		if put.Devices == nil {
			put.Devices = map[string]map[string]string{}
		}
		maps.Copy(put.Config, det.setConfig)
		for _, key := range det.delConfig {
			delete(put.Config, key)
		}
		for n, dev := range det.setDevices {
			put.Devices[n] = maps.Clone(dev)
		}
		for _, n := range det.delDevices {
			delete(put.Devices, n)
		}
		if det.profiles != nil {
			put.Profiles = slices.Clone(det.profiles)
		}
		if det.descr != nil {
			put.Description = *det.descr
		}
		err = c.UpdateInstance(ctx, k.name, put, etag)
		if !incus.HasStatus(err, http.StatusPreconditionFailed) {
			break
		}
	}
	if err != nil {
		return k.withHostGPUs(ctx, err, det.setDevices)
	}
	return nil
}

// save records what the agent manages now.
func (k *Container) save(env *agent.Env, det *containerDetail) error {
	if env == nil || env.State == nil {
		return nil
	}
	var rec Record
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	if det.imageRecord != "" {
		rec.Image, rec.Fingerprint = det.imageRecord, det.fingerprint
	}
	rec.Instance, rec.UUID, rec.Base = k.name, det.uuid, k.planName()
	rec.Config = containerKeys(k.config)
	rec.Devices = containerKeys(k.devices)
	return env.State.Save(rec)
}

// saveIntent records, before a create or a PUT, every key and device the agent is about to
// manage on top of those it already did. A kill between the change and save would
// otherwise leave keys on the instance that no record claims (and the next plan would
// leave them alone as somebody else's); with the intent saved first, the next plan
// removes what the plan no longer names.
func (k *Container) saveIntent(env *agent.Env, det *containerDetail) error {
	if env == nil || env.State == nil {
		return nil
	}
	var rec Record
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	if !rec.of(k.name, det.uuid) || det.create || det.replace {
		// Claims on another instance (or on the one about to be replaced) do not carry
		// over: a new instance carries only what this apply sets.
		rec = Record{Image: rec.Image, Fingerprint: rec.Fingerprint, Retiring: rec.Retiring, RetiringUUID: rec.RetiringUUID, RetiringMember: rec.RetiringMember}
	}
	rec.Instance, rec.UUID, rec.Base = k.name, det.uuid, k.planName()
	if det.create || det.replace {
		rec.UUID = "" // the new instance's is not known before it exists
	}
	rec.Config = union(rec.Config, containerKeys(k.config))
	rec.Devices = union(rec.Devices, containerKeys(k.devices))
	return env.State.Save(rec)
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}

// start starts the instance; a failure names the host's GPUs when the plan asks for some.
func (k *Container) start(ctx context.Context, c *incus.Client) error {
	if err := c.Start(ctx, k.name); err != nil {
		return k.withHostGPUs(ctx, err, k.devices)
	}
	return nil
}

// stop stops the instance cleanly within the stop timeout, then kills it, and verifies
// that it stopped.
func (k *Container) stop(ctx context.Context, c *incus.Client, env *agent.Env) error {
	st, err := c.InstanceState(ctx, k.name)
	if err != nil {
		return err
	}
	if st.StatusCode == incus.StatusStopped {
		return nil
	}
	if err := c.Stop(ctx, k.name, k.stopTimeout); err != nil {
		if env != nil && env.Log != nil {
			env.Log.Warn("clean stop failed; killing", "instance", k.name, "stop_timeout", k.stopTimeout, "error", err)
		}
		if kerr := c.Kill(ctx, k.name); kerr != nil {
			return fmt.Errorf("stop instance %s: %w; then kill: %w", k.name, err, kerr)
		}
	}
	st, err = c.InstanceState(ctx, k.name)
	if err != nil {
		return err
	}
	if st.StatusCode != incus.StatusStopped {
		return fmt.Errorf("instance %s is %s after stop and kill", k.name, st.Status)
	}
	return nil
}

// withHostGPUs adds the GPUs this host has to an error when devs include a GPU.
func (k *Container) withHostGPUs(ctx context.Context, err error, devs map[string]map[string]string) error {
	for _, dev := range devs {
		if dev["type"] == "gpu" {
			return fmt.Errorf("%w; %s", err, k.hostGPUs(ctx))
		}
	}
	return err
}

// hostGPUs describes the GPUs this host has, for the error of a gpu device that names
// one it does not: DRM cards by PCI address, and what the NVIDIA driver sees.
func (k *Container) hostGPUs(ctx context.Context) string {
	root := k.host.Root
	if root == "" {
		root = "/"
	}
	var found []string
	seen := map[string]bool{}
	entries, _ := filepath.Glob(filepath.Join(root, "dev/dri/by-path/pci-*-card"))
	for _, e := range entries {
		base := filepath.Base(e)
		addr := gpu.NormalizePCIBusID(strings.TrimSuffix(strings.TrimPrefix(base, "pci-"), "-card"))
		card := ""
		if target, err := filepath.EvalSymlinks(e); err == nil {
			card = " " + filepath.Base(target)
		}
		seen[addr] = true
		found = append(found, fmt.Sprintf("pci %s (DRM%s)", addr, card))
	}
	nvidia := ""
	if k.host.GPU != nil {
		info, err := k.host.GPU.Observe(ctx)
		switch {
		case err != nil:
			nvidia = "NVIDIA driver: " + err.Error()
		case info.State != gpu.StateOK:
			nvidia = "NVIDIA driver: " + info.State.Message()
		default:
			for _, g := range info.GPUs {
				addr := gpu.NormalizePCIBusID(g.PCIBusID)
				desc := fmt.Sprintf("pci %s (%s, nvidia-smi index %d)", addr, g.Name, g.Index)
				if seen[addr] {
					for i, f := range found {
						if strings.HasPrefix(f, "pci "+addr+" ") {
							found[i] = desc
						}
					}
					continue
				}
				found = append(found, desc)
			}
		}
	}
	msg := "GPUs on this host: "
	if len(found) == 0 {
		msg += "none found (no /dev/dri/by-path/pci-*-card entries)"
	} else {
		msg += strings.Join(found, ", ")
	}
	if nvidia != "" {
		msg += "; " + nvidia
	}
	return msg
}
