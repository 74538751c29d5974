package container

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
)

// A container on an Incus cluster is reached through one member's socket (the plan's
// incus_socket): the cluster forwards every call to the member that holds the instance.
// What the agent adds on top is placement: `target` names the member a new instance is
// created on, its gpu devices are checked against that member's hardware (not this
// host's), and a member that is offline is an observed state, not a guess built from
// the cluster database's stale view of the instance.

// placement checks the member that holds an existing instance: online, and the GPUs its
// gpu devices select. An instance on a lone
// (unclustered) daemon has no member.
func (k *Container) placement(ctx context.Context, seen *agent.Memory, c *incus.Client, inst *incus.Instance) error {
	member := resources.InstanceMember(inst)
	if member == "" {
		return nil
	}
	if err := resources.MemberOnline(ctx, seen, c, member, k.name); err != nil {
		return err
	}
	// A member other than the target is a migration (container_migrate.go), decided
	// before placement is checked.
	return k.checkMemberGPUs(ctx, c, member)
}

// getInstance reads an instance the way observe and status need it on a cluster: the
// member holding it is asked about first (MemberOnline), and the read, which the cluster
// forwards to that member, runs under incus.WhileOnline, so that a member whose incusd
// hung just before the read returns the cluster's word on it within a second of the
// cluster reporting it Offline. Unguarded, such a read hangs until the member is back
// (measured: 84 s, as long as it was frozen) or the step's deadline ends it with
// "context deadline exceeded", and no watch runs meanwhile (issue 26's CI run: a resync
// that began while m2 still read Online held the container's reconcile for 30 s).
// member is set when err is the member's being down; a missing instance is err as
// Incus gives it (incus.IsNotFound).
func getInstance(ctx context.Context, seen *agent.Memory, c *incus.Client, name string) (inst *incus.Instance, member string, err error) {
	read := func(ctx context.Context) (err error) {
		inst, _, err = c.GetInstance(ctx, name)
		return err
	}
	if member, _ = c.InstanceMember(ctx, name); member == "" || member == "none" {
		member, err = "", read(ctx) // not on a cluster, or the cluster cannot say
	} else if err = resources.MemberOnline(ctx, seen, c, member, name); err != nil {
		return nil, member, err // down (agent.Unavailable), or the cluster did not answer
	} else {
		err = c.WhileOnline(ctx, member, read)
	}
	if fell, ok := errors.AsType[*incus.MemberFellError](err); ok {
		err = resources.MemberDownErr(fell.Member, name)
	}
	switch {
	case err == nil:
		return inst, "", nil
	case incus.IsNotFound(err):
		return nil, "", err
	case agent.IsUnavailable(err):
		return nil, member, err
	}
	if down, oerr := offlineMember(ctx, seen, c, name, err); oerr != nil {
		return nil, down, oerr
	}
	return nil, "", resources.ReachErr(c, err)
}

// checkTarget checks, before a create, that the target is an online member of the
// cluster and that it has the GPUs the plan's gpu devices select by PCI address.
func (k *Container) checkTarget(ctx context.Context, c *incus.Client) error {
	if k.target == "" {
		return nil
	}
	cl, err := c.Cluster(ctx)
	if err != nil {
		return resources.ReachErr(c, err)
	}
	if !cl.Enabled {
		return agent.Terminal(fmt.Errorf("target = %q, but the Incus daemon at %s is not part of a cluster: drop target, or point incus_socket at a cluster member", k.target, c.Socket()))
	}
	m, err := c.ClusterMember(ctx, k.target)
	if incus.IsNotFound(err) {
		names := "none"
		if ms, lerr := c.ClusterMembers(ctx); lerr == nil {
			var all []string
			for _, m := range ms {
				all = append(all, m.ServerName)
			}
			names = strings.Join(all, ", ")
		}
		return agent.Terminal(fmt.Errorf("target %q is not a member of the cluster (members: %s)", k.target, names))
	}
	if err != nil {
		return err
	}
	if !m.Online() {
		return fmt.Errorf("target %s: instance %s cannot be created there until it is back (incus cluster list)", m.Describe(), k.name)
	}
	return k.checkMemberGPUs(ctx, c, k.target)
}

// memberResources is the part of GET /1.0/resources the GPU check reads.
type memberResources struct {
	GPU struct {
		Cards []struct {
			PCIAddress string `json:"pci_address"`
			Vendor     string `json:"vendor"`
			Product    string `json:"product"`
			Driver     string `json:"driver"`
		} `json:"cards"`
	} `json:"gpu"`
}

// checkMemberGPUs fails, naming the member's GPUs, when a gpu device selects a PCI
// address the member does not have: Incus would only say so when the instance starts.
func (k *Container) checkMemberGPUs(ctx context.Context, c *incus.Client, member string) error {
	var want []string
	for _, name := range containerKeys(k.devices) {
		if dev := k.devices[name]; dev["type"] == "gpu" && dev["pci"] != "" {
			want = append(want, name)
		}
	}
	if len(want) == 0 {
		return nil
	}
	var res memberResources
	if err := c.Query(ctx, http.MethodGet, "/1.0/resources?target="+url.QueryEscape(member), nil, &res); err != nil {
		return fmt.Errorf("read the GPUs of member %s: %w", member, err)
	}
	have := map[string]bool{}
	var found []string
	for _, card := range res.GPU.Cards {
		addr := gpu.NormalizePCIBusID(card.PCIAddress)
		have[addr] = true
		found = append(found, fmt.Sprintf("pci %s (%s %s, driver %s)", addr, card.Vendor, card.Product, noneIfEmpty(card.Driver)))
	}
	var errs []error
	for _, name := range want {
		if addr := k.devices[name]["pci"]; !have[gpu.NormalizePCIBusID(addr)] {
			list := "none found"
			if len(found) > 0 {
				list = strings.Join(found, ", ")
			}
			errs = append(errs, fmt.Errorf("gpu %q selects pci %s, which member %s does not have; GPUs on member %s: %s", name, addr, member, member, list))
		}
	}
	return errors.Join(errs...)
}

// offlineMember explains a failed read of an instance when the member holding it is not
// online: the cluster cannot forward to it and answers a 500 ("Server isn't ready yet").
// It returns the member and the explanation, or "" and nil when the failure is something
// else (the caller reports that as it is).
func offlineMember(ctx context.Context, seen *agent.Memory, c *incus.Client, instance string, readErr error) (string, error) {
	var ie *incus.Error
	if !errors.As(readErr, &ie) || ie.Status < 500 {
		return "", nil
	}
	member, err := c.InstanceMember(ctx, instance)
	if err != nil || member == "" || member == "none" {
		return "", nil
	}
	if err := resources.MemberOnline(ctx, seen, c, member, instance); err != nil {
		return member, fmt.Errorf("%w (reading it: %v)", err, readErr)
	}
	return "", nil
}
