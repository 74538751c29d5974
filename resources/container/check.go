package container

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
)

// resolveImage turns the image attribute into a local image fingerprint.
func resolveImage(ctx context.Context, c *incus.Client, image string) (string, error) {
	name := image
	if remote, alias, ok := strings.Cut(image, ":"); ok {
		if remote != "local" {
			return "", fmt.Errorf("image %q names the remote %q, which is not configured for the agent: it creates instances only from images its Incus daemon holds. Copy the image first (incus image copy %s local: --alias %s) and write image = %q",
				image, remote, image, alias, alias)
		}
		name = alias
	}
	a, err := c.GetImageAlias(ctx, name)
	if err == nil {
		return a.Target, nil
	}
	if !incus.IsNotFound(err) {
		return "", resources.ReachErr(c, err)
	}
	if len(name) >= 12 && strings.Trim(strings.ToLower(name), "0123456789abcdef") == "" {
		img, ferr := c.GetImage(ctx, name)
		if ferr == nil {
			return img.Fingerprint, nil
		}
		if !incus.IsNotFound(ferr) {
			return "", ferr
		}
	}
	return "", fmt.Errorf("image %q: no local image has that alias or fingerprint (incus image list shows what the daemon holds)", image)
}

// Check observes the instance and compares it with the plan; a migration's break work
// left (its retiring instance) is part of what it reports.
func (k *Container) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if k.Delete {
		return k.checkAbsent(ctx, env)
	}
	live, rec, err := k.liveView(env)
	if err != nil {
		return nil, err
	}
	d, err := live.observe(ctx, env, rec)
	if d != nil {
		d.Unfinished = k.unfinished(rec)
	}
	return d, err
}

// observe is Check on the live instance, rec its record: where the instance is (missing,
// on another member, placed), then each aspect in turn, as mgmt checks a file's
// content, mode and owner apart: what cannot change in place (immutables), config keys,
// devices, profiles, power and the userspace driver. Each aspect adds its changes to d
// and what Apply needs to det.
func (k *Container) observe(ctx context.Context, env *agent.Env, rec Record) (*agent.Diff, error) {
	c := k.client(env)
	inst, _, err := getInstance(ctx, env.Memory, c, k.name)
	if incus.IsNotFound(err) {
		return k.createDiff(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	if member := resources.InstanceMember(inst); member != "" && k.target != "" && member != k.target {
		if err := resources.MemberOnline(ctx, env.Memory, c, member, k.name); err != nil {
			return nil, err
		}
		return k.migrateDiff(ctx, c, env, inst, rec)
	}
	if err := k.placement(ctx, env.Memory, c, inst); err != nil {
		return nil, err
	}
	uuid := inst.Config["volatile.uuid"]
	if !rec.of(k.name, uuid) {
		rec = Record{} // another instance's record: nothing here is claimed
	}
	det := &containerDetail{setConfig: map[string]string{}, setDevices: map[string]map[string]string{},
		imageRecord: rec.Image, fingerprint: rec.Fingerprint, uuid: uuid}
	d := &agent.Diff{Detail: det}

	if replace, err := k.checkImmutables(ctx, c, inst, rec, d, det); err != nil || replace {
		if err != nil {
			return nil, err
		}
		return d.Derive(), nil
	}
	if err := k.checkPrivileged(inst); err != nil {
		return nil, err
	}
	restartConfig, unmanagedConfig := k.checkConfig(inst, rec, d, det)
	restartDevices, unmanagedDevices := k.checkDevices(inst, rec, d, det)
	if unmanaged := append(unmanagedConfig, unmanagedDevices...); len(unmanaged) > 0 {
		d.Warnings = append(d.Warnings, fmt.Sprintf("instance %s has settings the plan does not name, left as they are: %s", k.name, strings.Join(unmanaged, ", ")))
	}
	k.checkProfiles(inst, d, det)
	det.put = len(d.Changes) > 0
	if err := k.checkPower(inst, restartConfig || restartDevices, d, det); err != nil {
		return nil, err
	}
	if err := k.checkUserspace(ctx, c, inst, d, det); err != nil {
		return nil, err
	}

	if len(d.Changes) == 0 {
		d = agent.NoChange()
	}
	if rec.Retiring != "" {
		d.Warnings = append(d.Warnings, fmt.Sprintf("migration: instance %s on member %s retires (stopped and deleted) once every resource that depends on this container verified in %s",
			rec.Retiring, noneIfEmpty(rec.RetiringMember), k.name))
	}
	if len(d.Changes) == 0 {
		return d, nil
	}
	// A key or device that needs a restart restarts only an instance that runs and stays
	// running; otherwise it is set in place.
	for i := range d.Changes {
		if d.Changes[i].Note == "restart" {
			d.Changes[i].Note = ""
			if det.restart {
				d.Changes[i].Effect = agent.Restarts
			}
		}
	}
	return d.Derive(), nil
}

// checkImmutables compares what cannot change in place, the type and the image: a
// difference is a replace (replace = "allowed"), or a terminal error. It reports whether
// d is that replace.
func (k *Container) checkImmutables(ctx context.Context, c *incus.Client, inst *incus.Instance, rec Record, d *agent.Diff, det *containerDetail) (bool, error) {
	var replace []agent.Change
	if inst.Type != k.itype {
		replace = append(replace, agent.Set("type", inst.Type, k.itype).Because(agent.Replaces, agent.ReasonImmutable))
	}
	base := inst.Config["volatile.base_image"]
	sameImage := rec.Image == k.image && rec.Fingerprint != "" && rec.Fingerprint == base
	var fp string
	if !sameImage {
		var err error
		fp, err = resolveImage(ctx, c, k.image)
		if err != nil {
			return false, err
		}
		switch {
		case fp == base:
			det.imageRecord, det.fingerprint = k.image, base
		case base == "":
			d.Warnings = append(d.Warnings, fmt.Sprintf("instance %s records no base image (volatile.base_image); image %q is not compared", k.name, k.image))
		default:
			ch := agent.Set("image", shortFP(base), fmt.Sprintf("%s (%s)", k.image, shortFP(fp)))
			replace = append(replace, ch.Because(agent.Replaces, agent.ReasonImmutable))
		}
	} else if now, err := resolveImage(ctx, c, k.image); err == nil && now != base {
		d.Warnings = append(d.Warnings, fmt.Sprintf("image %q now points to %s; instance %s was created from %s and is not replaced for that (write the new fingerprint as image, with replace = \"allowed\", to rebuild it)",
			k.image, shortFP(now), k.name, shortFP(base)))
	}
	if len(replace) == 0 {
		return false, nil
	}
	if !k.allowReplace {
		var what []string
		for _, ch := range replace {
			what = append(what, fmt.Sprintf("%s %s → %s", ch.Attr, agent.Render(ch.Old), agent.Render(ch.New)))
		}
		// Terminal: retrying cannot help until the plan changes (agent run stops trying).
		return false, agent.Terminal(fmt.Errorf("instance %s needs a replace (%s): Incus cannot change an instance's image or type in place, and replace = \"refuse\". Set replace = \"allowed\" to delete and recreate it (its root filesystem and snapshots are lost; host directories of disk devices are kept)",
			k.name, strings.Join(what, ", ")))
	}
	d.Changes = replace
	det.replace = true
	det.fingerprint = fp
	det.imageRecord = k.image
	d.Add(agent.Change{Attr: "devices", Note: "disk devices' host directories are kept", New: agent.Raw(fmt.Sprintf("(%d declared)", len(k.devices))), HasNew: true,
		Effect: agent.Replaces, Reason: agent.ReasonImmutable})
	return true, nil
}

// checkPrivileged refuses nvidia_runtime in an instance that is privileged, by its
// config or a profile: the runtime's hook refuses privileged containers.
func (k *Container) checkPrivileged(inst *incus.Instance) error {
	if !k.nvidiaRT {
		return nil
	}
	priv := inst.ExpandedConfig["security.privileged"]
	if v, ok := k.config["security.privileged"]; ok {
		priv = v
	}
	if priv == "true" {
		return fmt.Errorf("nvidia_runtime = true in instance %s, which is privileged (security.privileged = \"true\", from its config or a profile): the NVIDIA container runtime hook refuses privileged containers. Make it unprivileged, or drop nvidia_runtime and use gpu blocks with nvidia_userspace", k.name)
	}
	return nil
}

// checkConfig compares the config keys the plan names, and removes the keys an earlier
// apply set (by rec) that the plan no longer names. It reports whether a change needs a
// restart, and the keys nobody manages (left alone, named in a warning).
func (k *Container) checkConfig(inst *incus.Instance, rec Record, d *agent.Diff, det *containerDetail) (restart bool, unmanaged []string) {
	for _, key := range containerKeys(k.config) {
		want := k.config[key]
		have, ok := inst.Config[key]
		if ok && have == want {
			continue
		}
		ch := agent.Added(fmt.Sprintf("config[%q]", key), want)
		if ok {
			ch = agent.Set(fmt.Sprintf("config[%q]", key), have, want)
		}
		ch.Sensitive = k.sensitiveConfig(key)
		if needsRestart(key) {
			ch.Note = "restart"
			restart = true
		}
		d.Add(ch)
		det.setConfig[key] = want
	}
	for _, key := range rec.Config {
		if _, planned := k.config[key]; planned || serverOwned(key) {
			continue
		}
		if have, ok := inst.Config[key]; ok {
			ch := agent.Removed(fmt.Sprintf("config[%q]", key), have)
			if needsRestart(key) {
				ch.Note = "restart"
				restart = true
			}
			d.Add(ch)
			det.delConfig = append(det.delConfig, key)
		}
	}
	for _, key := range containerKeys(inst.Config) {
		if _, planned := k.config[key]; !planned && !serverOwned(key) && !slices.Contains(rec.Config, key) {
			unmanaged = append(unmanaged, "config "+key)
		}
	}
	return restart, unmanaged
}

// checkDevices is checkConfig for devices.
func (k *Container) checkDevices(inst *incus.Instance, rec Record, d *agent.Diff, det *containerDetail) (restart bool, unmanaged []string) {
	for _, name := range containerKeys(k.devices) {
		want := k.devices[name]
		have, ok := inst.Devices[name]
		if ok && maps.Equal(have, want) {
			continue
		}
		attr := fmt.Sprintf("%s[%q]", k.deviceKind[name], name)
		ch := agent.Change{Attr: attr, New: incusDevice(want), HasNew: true}
		if ok {
			ch.Old, ch.HasOld = incusDevice(have), true
		}
		if k.deviceRestart(want, have) {
			ch.Note = "restart"
			restart = true
		}
		d.Add(ch)
		det.setDevices[name] = want
	}
	for _, name := range rec.Devices {
		if _, planned := k.devices[name]; planned {
			continue
		}
		if have, ok := inst.Devices[name]; ok {
			ch := agent.Change{Attr: fmt.Sprintf("device[%q]", name), Old: incusDevice(have), HasOld: true}
			if k.deviceRestart(nil, have) {
				ch.Note = "restart"
				restart = true
			}
			d.Add(ch)
			det.delDevices = append(det.delDevices, name)
		}
	}
	for _, name := range containerKeys(inst.Devices) {
		if _, planned := k.devices[name]; !planned && !slices.Contains(rec.Devices, name) {
			unmanaged = append(unmanaged, "device "+name)
		}
	}
	return restart, unmanaged
}

// checkProfiles compares the profiles, in order, and the description.
func (k *Container) checkProfiles(inst *incus.Instance, d *agent.Diff, det *containerDetail) {
	if !slices.Equal(inst.Profiles, k.profiles) {
		d.Add(agent.Set("profiles", inst.Profiles, k.profiles))
		det.profiles = k.profiles
	}
	if k.description != nil && inst.Description != *k.description {
		d.Add(agent.Set("description", inst.Description, *k.description))
		det.descr = k.description
	}
}

// checkPower compares running with the plan; a frozen instance is an error. A change
// that needs a restart (needRestart) restarts only an instance that runs and stays
// running.
func (k *Container) checkPower(inst *incus.Instance, needRestart bool, d *agent.Diff, det *containerDetail) error {
	isRunning := inst.StatusCode == incus.StatusRunning
	switch {
	case inst.StatusCode == incus.StatusFrozen:
		return fmt.Errorf("instance %s is frozen: unfreeze it (incus start %s) and plan again", k.name, k.name)
	case k.running && !isRunning:
		ch := agent.Set("running", false, true)
		ch.Note = "starts the instance"
		d.Add(ch)
		det.start = true
	case !k.running && isRunning:
		ch := agent.Set("running", true, false)
		ch.Note = "stops the instance"
		d.Add(ch)
		det.stop = true
	}
	det.restart = needRestart && isRunning && k.running
	return nil
}

// checkUserspace compares the NVIDIA userspace driver inside a running instance with
// nvidia_userspace: installed with the verified installer, or an error naming the fix.
func (k *Container) checkUserspace(ctx context.Context, c *incus.Client, inst *incus.Instance, d *agent.Diff, det *containerDetail) error {
	if k.userspace == "" || inst.StatusCode != incus.StatusRunning || !k.running {
		return nil
	}
	have, err := k.userspaceVersion(ctx, c)
	if err != nil {
		return err
	}
	if have == k.userspace {
		return nil
	}
	old := have
	if old == "" {
		old = "(none)"
	}
	ch := agent.Set("nvidia_userspace", old, k.userspace)
	if k.installer != nil {
		ch.Note = "installed inside with the verified installer, --no-kernel-module"
		det.installUserspace = true
	} else {
		ch.Note = "must match the host's kernel module; no nvidia_installer to install it"
		det.userspaceErr = k.userspaceFix(have)
	}
	d.Add(ch)
	return nil
}

// deviceRestart reports whether changing a device from have to want needs the instance
// restarted: GPUs (CUDA enumerates devices when a process starts, and the NVIDIA
// runtime hook runs at container start), and every device of a VM.
func (k *Container) deviceRestart(want, have map[string]string) bool {
	return k.itype == "virtual-machine" || want["type"] == "gpu" || have["type"] == "gpu"
}

func (k *Container) createDiff(ctx context.Context, c *incus.Client) (*agent.Diff, error) {
	fp, err := resolveImage(ctx, c, k.image)
	if err != nil {
		return nil, err
	}
	if err := k.checkTarget(ctx, c); err != nil {
		return nil, err
	}
	if err := k.checkRoom(ctx, c, fp); err != nil {
		return nil, err
	}
	if k.nvidiaRT {
		if err := k.checkProfilesPrivileged(ctx, c); err != nil {
			return nil, err
		}
	}
	det := &containerDetail{create: true, fingerprint: fp, imageRecord: k.image, start: k.running}
	d := &agent.Diff{Detail: det}
	d.Add(agent.Added("name", k.name))
	d.Add(agent.Added("image", fmt.Sprintf("%s (%s)", k.image, shortFP(fp))))
	if k.itype != "container" {
		d.Add(agent.Added("type", k.itype))
	}
	d.Add(agent.Added("profiles", k.profiles))
	if k.description != nil {
		d.Add(agent.Added("description", *k.description))
	}
	if k.target != "" {
		d.Add(agent.Added("target", k.target))
	}
	for _, key := range containerKeys(k.config) {
		ch := agent.Added(fmt.Sprintf("config[%q]", key), k.config[key])
		ch.Sensitive = k.sensitiveConfig(key)
		d.Add(ch)
	}
	for _, name := range containerKeys(k.devices) {
		d.Add(agent.Change{Attr: fmt.Sprintf("%s[%q]", k.deviceKind[name], name), New: incusDevice(k.devices[name]), HasNew: true})
	}
	d.Add(agent.Added("running", k.running))
	if k.userspace != "" {
		ch := agent.Added("nvidia_userspace", k.userspace)
		ch.Note = "checked once the instance runs"
		d.Add(ch)
	}
	for i := range d.Changes {
		d.Changes[i] = d.Changes[i].Because(agent.Creates, agent.ReasonMissing)
	}
	return d.Derive(), nil
}

// checkProfilesPrivileged refuses nvidia_runtime when a profile makes the container
// privileged and the plan's config does not say otherwise.
func (k *Container) checkProfilesPrivileged(ctx context.Context, c *incus.Client) error {
	if _, ok := k.config["security.privileged"]; ok {
		return nil // bind refused "true"
	}
	for _, p := range k.profiles {
		var prof struct {
			Config map[string]string `json:"config"`
		}
		if err := c.Query(ctx, http.MethodGet, "/1.0/profiles/"+p, nil, &prof); err != nil {
			if incus.IsNotFound(err) {
				return fmt.Errorf("profile %q does not exist on the Incus daemon", p)
			}
			return err
		}
		if prof.Config["security.privileged"] == "true" {
			return fmt.Errorf("nvidia_runtime = true, but profile %q makes the container privileged (security.privileged = \"true\"): the NVIDIA container runtime hook refuses privileged containers. Set config = { \"security.privileged\" = \"false\" } or drop nvidia_runtime", p)
		}
	}
	return nil
}
