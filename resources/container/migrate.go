package container

import (
	"context"
	"fmt"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
)

// A migration is a change of a container's target: the instance must end up on another
// cluster member. SPEC: "Changing a container's `target` is a make-before-break
// migration: new instance ready and smoke-tested, then the old one stopped and deleted."
//
// A running instance is migrated make before break. Instance names are unique in a
// cluster, so the new instance is built beside the old one under the pair name (NAME
// and NAME-b alternate; the record says which one is live):
//
//  1. the record names the pair as being built (intent first: a kill leaves a record
//     that says the pair is the agent's, never live, and may be deleted and rebuilt);
//  2. the pair is created on the target from the plan (image, config, devices: a disk
//     device's source is a host path on that member, so the weights come from there;
//     nothing of the old root filesystem is copied), started and verified running;
//  3. the record names the pair live and the old instance retiring. Servers in the
//     container then see the new live instance: each launches there, verified, and keeps
//     its old process as retiring;
//  4. once every dependent verified (agent.Finisher), the old instance is stopped and
//     deleted, verified gone, and the record forgets it.
//
// A stopped instance, one the plan keeps stopped, or one no server of the agent runs in
// (by the servers' records) is moved instead (incus move): stopped first if it runs,
// started again after when the plan wants it running. Its root filesystem goes with it.

// pairName is the other name of the plan's instance base: base-b for base, base for
// base-b.
func pairName(base, current string) string {
	if current == base {
		return base + "-b"
	}
	return base
}

// planName is the plan's instance name (the name of a view of the live pair is not).
func (k *Container) planName() string {
	if k.base != "" {
		return k.base
	}
	return k.name
}

// view is the container acting on the instance named name: the live pair of a migrated
// container, or the retiring one. It shares the plan, the host and the clients.
func (k *Container) view(name string) *Container {
	if name == k.name {
		return k
	}
	v := *k
	v.base, v.name = k.planName(), name
	return &v
}

// liveView is the container acting on its live instance, as its record says: the plan's
// name, or its pair after a migration.
func (k *Container) liveView(env *agent.Env) (*Container, Record, error) {
	var rec Record
	if env != nil && env.State != nil {
		if _, err := env.State.Load(&rec); err != nil {
			return nil, rec, err
		}
	}
	base := k.planName()
	if rec.Base == base && rec.Instance == pairName(base, base) {
		return k.view(rec.Instance), rec, nil
	}
	return k, rec, nil
}

// migrateDiff is the diff of an instance on another member than the plan's target.
func (k *Container) migrateDiff(ctx context.Context, c *incus.Client, env *agent.Env, inst *incus.Instance, rec Record) (*agent.Diff, error) {
	member := resources.InstanceMember(inst)
	if rec.Retiring != "" {
		return nil, fmt.Errorf("instance %s runs on member %s, but the plan's target is %s, and the previous migration is not finished (instance %s on %s still retires once the servers in %s verify): apply until it is, then change the target",
			k.name, member, k.target, rec.Retiring, noneIfEmpty(rec.RetiringMember), k.name)
	}
	if err := k.checkTarget(ctx, c); err != nil {
		return nil, err
	}
	det := &containerDetail{migrate: true, from: member, uuid: inst.Config["volatile.uuid"],
		imageRecord: rec.Image, fingerprint: rec.Fingerprint}
	d := &agent.Diff{Detail: det}
	ch := agent.Set("target", member, k.target)
	running := inst.StatusCode == incus.StatusRunning
	if running && k.running && k.host.ServersIn(env, k.name) {
		pair := pairName(k.planName(), k.name)
		if !resources.ValidInstanceName(pair) {
			return nil, agent.Terminal(fmt.Errorf("instance %s must move from member %s to %s make before break, under the pair name %s, which is not a valid instance name (at most 63 characters): shorten the container's name",
				k.name, member, k.target, pair))
		}
		fp, err := resolveImage(ctx, c, k.image)
		if err != nil {
			return nil, err
		}
		det.pair, det.fingerprint, det.imageRecord = pair, fp, k.image
		ch.Note = fmt.Sprintf("make before break: new instance %s on %s (from the image; disks from %s's paths), verified with the servers in it, before %s on %s is stopped and deleted",
			pair, k.target, k.target, k.name, member)
		d.Add(ch.Because(agent.Replaces, agent.ReasonMigrate))
	} else {
		det.move = true
		switch {
		case !running:
			ch.Note = "incus move: the instance is stopped, its root filesystem moves with it"
			d.Add(ch.Because(agent.InPlace, agent.ReasonMigrate))
		case k.running:
			ch.Note = "stopped, moved with incus move (its root filesystem with it) and started again: no server of the plan runs in it"
			d.Add(ch.Because(agent.Restarts, agent.ReasonMigrate))
		default:
			ch.Note = "stopped (running = false), then moved with incus move"
			d.Add(ch.Because(agent.Restarts, agent.ReasonMigrate))
		}
	}
	return d.Derive(), nil
}

// applyMove stops the instance if it runs (the plan keeps it stopped), moves it to the
// target, verifies where it is, and carries out what else differs there.
func (k *Container) applyMove(ctx context.Context, c *incus.Client, env *agent.Env, det *containerDetail) error {
	if err := k.stop(ctx, c, env); err != nil {
		return err
	}
	if err := c.MoveInstance(ctx, k.name, k.target); err != nil {
		return resources.ReachErr(c, err)
	}
	member, err := c.InstanceMember(ctx, k.name)
	if err != nil {
		return err
	}
	if member != k.target {
		return fmt.Errorf("instance %s is on member %s after incus move --target %s", k.name, member, k.target)
	}
	env.Log.Info("moved instance", "instance", k.name, "from", det.from, "to", k.target)
	rest, err := k.Check(ctx, env)
	if err != nil || rest.Action == agent.NoOp {
		return err
	}
	return k.Apply(ctx, env, rest)
}

// applyMigrate builds the pair on the target, verified, and records it live and the old
// instance retiring; the old one is left running (Finish deletes it).
func (k *Container) applyMigrate(ctx context.Context, c *incus.Client, env *agent.Env, det *containerDetail) error {
	var rec Record
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	pair := k.view(det.pair)
	// The intent first: the pair is the agent's, not live yet.
	rec.Base, rec.Instance, rec.Building = k.planName(), k.name, det.pair
	if err := env.State.Save(rec); err != nil {
		return err
	}
	// What an interrupted build left of the pair (never live: the record still names
	// the old instance) is deleted and built again.
	if _, _, err := c.GetInstance(ctx, pair.name); err == nil {
		env.Log.Warn("deleting what an interrupted migration built", "instance", pair.name)
		if err := pair.stopAndDelete(ctx, c, env); err != nil {
			return err
		}
	} else if !incus.IsNotFound(err) {
		return resources.ReachErr(c, err)
	}
	env.Log.Info("migrating: building the new instance", "instance", pair.name, "member", k.target, "from", k.name, "on", det.from)
	if err := c.CreateInstance(ctx, pair.post(det.fingerprint)); err != nil {
		return err
	}
	inst, _, err := c.GetInstance(ctx, pair.name)
	if err != nil {
		return err
	}
	if err := pair.start(ctx, c); err != nil {
		return err
	}
	st, err := c.InstanceState(ctx, pair.name)
	if err != nil {
		return err
	}
	if st.StatusCode != incus.StatusRunning {
		return fmt.Errorf("new instance %s on %s is %s after its start", pair.name, k.target, st.Status)
	}
	if err := pair.verifyUserspace(ctx, c, env); err != nil {
		return err
	}
	// Live: from here on the servers in the container launch in the pair.
	rec = Record{Base: k.planName(), Instance: pair.name, UUID: inst.Config["volatile.uuid"],
		Image: det.imageRecord, Fingerprint: det.fingerprint,
		Config: containerKeys(k.config), Devices: containerKeys(k.devices),
		Retiring: k.name, RetiringUUID: det.uuid, RetiringMember: det.from}
	if err := env.State.Save(rec); err != nil {
		return err
	}
	env.Log.Info("migrating: new instance live; the old one retires once its dependents verify", "instance", pair.name, "member", k.target, "retiring", k.name)
	return nil
}

var _ agent.Finisher = (*Container)(nil)

// unfinished names the break work a migration left, by the container's record rec: its
// retiring instance, or a pair an interrupted migration built and never made live.
func (k *Container) unfinished(rec Record) string {
	if rec.Base != k.planName() {
		return ""
	}
	if rec.Retiring == "" {
		if rec.Building != "" && rec.Building != rec.Instance {
			return fmt.Sprintf("instance %s, left by an interrupted migration and never live, deleted", rec.Building)
		}
		return ""
	}
	return fmt.Sprintf("retiring instance %s on member %s stopped and deleted (%s on %s is live)", rec.Retiring, noneIfEmpty(rec.RetiringMember), rec.Instance, noneIfEmpty(k.target))
}

// Finish stops and deletes the retiring instance, verified gone, and forgets it. An
// instance of that name that is not the one the record names (another uuid) is left
// alone.
func (k *Container) Finish(ctx context.Context, env *agent.Env) error {
	var rec Record
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	c := k.client(env)
	if rec.Retiring == "" {
		// The target went back before an interrupted migration's pair went live: that
		// pair is the agent's (the record says it built it) and serves nothing.
		if rec.Building == "" || rec.Building == rec.Instance {
			return nil
		}
		left := k.view(rec.Building)
		if _, _, err := c.GetInstance(ctx, left.name); err == nil {
			if err := left.stopAndDelete(ctx, c, env); err != nil {
				return err
			}
		} else if !incus.IsNotFound(err) {
			return resources.ReachErr(c, err)
		}
		rec.Building = ""
		return env.State.Save(rec)
	}
	old := k.view(rec.Retiring)
	inst, _, err := c.GetInstance(ctx, old.name)
	switch {
	case incus.IsNotFound(err):
	case err != nil:
		return resources.ReachErr(c, err)
	case rec.RetiringUUID != "" && inst.Config["volatile.uuid"] != rec.RetiringUUID:
		env.Log.Warn("the retiring instance's name is another instance now: left alone", "instance", old.name)
	default:
		if err := old.stopAndDelete(ctx, c, env); err != nil {
			return fmt.Errorf("retiring instance: %w", err)
		}
		env.Log.Info("deleted the retiring instance", "instance", old.name, "member", rec.RetiringMember)
	}
	rec.Retiring, rec.RetiringUUID, rec.RetiringMember = "", "", ""
	return env.State.Save(rec)
}

// ContainerPeers answers the other kinds' questions of the container records.
type ContainerPeers struct{}

// LiveInstance implements resources.Containers from the container records.
func (ContainerPeers) LiveInstance(env *agent.Env, name string) (live, retiring string) {
	live = name
	state.EachRecord(env.State.Others(), "container", func(_ string, rec Record) bool {
		if rec.Base != name {
			return true
		}
		if rec.Instance == pairName(name, name) {
			live = rec.Instance
		}
		retiring = rec.Retiring
		return false
	})
	return live, retiring
}
