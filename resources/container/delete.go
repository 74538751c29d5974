package container

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// A container is deleted (ensure = "absent", agent destroy, an orphan) by a verified stop
// (clean within stop_timeout, then killed, then observed stopped) and a delete of the
// instance, observed gone. Its disk devices' host directories are never touched, and
// storage volumes are never deleted: the kind creates none (a volume named by a device
// block is the operator's), so there is nothing the plan created to remove with it.

var _ agent.Ensurer = (*Container)(nil)

// AsAbsent is the container as agent destroy deletes it.
func (k *Container) AsAbsent() agent.Resource {
	return &Container{addr: k.addr, name: k.name, host: k.host, stopTimeout: k.stopTimeout, incus: k.incus,
		Deletion: resources.Deletion{Delete: true, Why: agent.ReasonDestroy}}
}

func (k *Container) bindEnsure(r *plans.Resource, ensure *string) hcl.Diagnostics {
	switch e := resources.Deref(ensure); e {
	case "", "present":
	case "absent":
		k.Deletion = resources.Deletion{Delete: true, Why: agent.ReasonEnsureAbsent}
	default:
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid ensure", Subject: r.Range("ensure").Ptr(),
			Detail: fmt.Sprintf("ensure is \"present\" or \"absent\", not %q.", e)}}
	}
	return nil
}

// orphanContainer deletes, from its record alone, the instance a container block that
// left the plan created: only that instance (its name and volatile.uuid), never another
// one that took its name since.
func orphanContainer(h resources.Machine, addr string, st *state.Scoped, a *plans.AgentSettings) (agent.Resource, error) {
	var rec Record
	has, err := st.Load(&rec)
	if err != nil || !has {
		return nil, err
	}
	if rec.Instance == "" {
		return resources.LeftAlone{Why: fmt.Sprintf("no longer in the plan, but its record (written by an older agent) does not name its instance: left alone; delete the instance yourself (incus delete), then %s.json in the state directory's resources/", addr)}, nil
	}
	return &Container{addr: addr, name: rec.Instance, host: h, stopTimeout: 30 * time.Second, incus: resources.NewIncus(a),
		Deletion: resources.Deletion{Delete: true, Why: agent.ReasonOrphan, Orphan: true}}, nil
}

func (k *Container) checkAbsent(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	k, _, err := k.liveView(env) // the live one of a migrated pair
	if err != nil {
		return nil, err
	}
	c := k.client(env)
	var rec Record
	has, err := env.State.Load(&rec)
	if err != nil {
		return nil, err
	}
	inst, _, err := c.GetInstance(ctx, k.name)
	notFound := incus.IsNotFound(err)
	if err != nil && !notFound {
		return nil, resources.ReachErr(c, err)
	}
	forget := func(why string) (*agent.Diff, error) {
		if !has {
			return agent.NoChange(), nil
		}
		d := &agent.Diff{Detail: &containerDetail{forget: true}}
		d.Add(agent.Change{Attr: "record", Old: agent.Raw(why), HasOld: true, Effect: agent.Deletes, Reason: k.Why})
		return d.Derive(), nil
	}
	if notFound {
		if left := rec.leftover(); has && left != "" {
			// The live instance is gone, but a migration's other half is not: it
			// leaves the host too (applyAbsent finishes it, verified).
			d := &agent.Diff{Detail: &containerDetail{remove: true}}
			c0 := agent.Removed("instance", agent.Raw(fmt.Sprintf("%s (a migration's other half; %s is gone)", left, k.name))).Because(agent.Deletes, k.Why)
			c0.Note = k.Why.Describe() + "; disk devices' host directories and storage volumes are kept"
			d.Add(c0)
			return d.Derive(), nil
		}
		return forget(fmt.Sprintf("instance %s is gone", k.name))
	}
	uuid := inst.Config["volatile.uuid"]
	if k.Orphan && !(rec.Instance == k.name && rec.UUID != "" && rec.UUID == uuid) {
		// Another instance now has the name (or the record never saw its uuid): not
		// the agent's to delete.
		d, err := forget(fmt.Sprintf("instance %s is not the one this agent created: left alone", k.name))
		if d != nil {
			d.Warnings = append(d.Warnings, fmt.Sprintf("instance %s (uuid %s) is not the instance the record names (uuid %s); it is left alone", k.name, uuid, noneIfEmpty(rec.UUID)))
		}
		return d, err
	}
	d := &agent.Diff{Detail: &containerDetail{remove: true, uuid: uuid}}
	c0 := agent.Removed("instance", agent.Raw(fmt.Sprintf("%s (%s)", k.name, strings.ToLower(inst.Status)))).Because(agent.Deletes, k.Why)
	c0.Note = k.Why.Describe() + "; disk devices' host directories and storage volumes are kept"
	d.Add(c0)
	return d.Derive(), nil
}

// applyAbsent stops the instance (verified), deletes it, and proves it gone.
func (k *Container) applyAbsent(ctx context.Context, env *agent.Env, det *containerDetail) error {
	if det.forget {
		return env.State.Delete()
	}
	k, _, err := k.liveView(env)
	if err != nil {
		return err
	}
	c := k.client(env)
	inst, _, err := c.GetInstance(ctx, k.name)
	if incus.IsNotFound(err) {
		// A migration's other half goes too, verified, before the record does.
		if err := k.Finish(ctx, env); err != nil {
			return err
		}
		return env.State.Delete()
	}
	if err != nil {
		return resources.ReachErr(c, err)
	}
	if det.uuid != "" && inst.Config["volatile.uuid"] != det.uuid {
		return fmt.Errorf("instance %s changed since it was observed (another uuid): not deleted; plan again", k.name)
	}
	if err := k.Finish(ctx, env); err != nil { // a migration's retiring instance goes too, first
		return err
	}
	if err := k.stopAndDelete(ctx, c, env); err != nil {
		return err
	}
	env.Log.Info("deleted instance", "instance", k.name, "reason", string(k.Why))
	return env.State.Delete()
}

// stopAndDelete stops the instance (verified), deletes it and proves it gone from the
// API: every delete of an instance the agent made (ensure = "absent", destroy, an
// orphan, a migration's other half) goes through here.
func (k *Container) stopAndDelete(ctx context.Context, c *incus.Client, env *agent.Env) error {
	if err := k.stop(ctx, c, env); err != nil {
		return fmt.Errorf("delete instance %s: %w", k.name, err)
	}
	if err := c.DeleteInstance(ctx, k.name); err != nil && !incus.IsNotFound(err) {
		return fmt.Errorf("delete instance %s: %w", k.name, err)
	}
	if _, _, err := c.GetInstance(ctx, k.name); !incus.IsNotFound(err) {
		return fmt.Errorf("instance %s still exists after its delete (%v)", k.name, err)
	}
	return nil
}

func (k *Container) absentStatus(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	c := k.client(env)
	inst, _, err := c.GetInstance(ctx, k.name)
	if incus.IsNotFound(err) {
		return &agent.Status{Healthy: true, Summary: "absent: instance " + k.name + " does not exist"}, nil
	}
	if err != nil {
		return nil, resources.ReachErr(c, err)
	}
	return &agent.Status{Healthy: false, Summary: fmt.Sprintf("instance %s exists (%s), but the plan says ensure = \"absent\": agent apply deletes it", k.name, strings.ToLower(inst.Status))}, nil
}
