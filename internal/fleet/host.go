package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/plans"
)

// HostRequest is the host permit a disruption of this host asks for under plan p: in
// its coordination block's host group, counting every server of p's rollout groups as
// down in its group (a host disruption takes them all down). cause is "driver", "drain"
// or "reboot"; detail says more (the versions, a drain's reason); bootID is this boot's.
func HostRequest(p *plans.Plan, cause, detail, bootID string) coord.HostRequest {
	hd := p.Agent.Coordination.HostDisruptions
	req := coord.HostRequest{Group: hd.Group, Max: hd.MaxUnavailable, Cause: cause, Detail: detail, BootID: bootID,
		Members: map[string][]string{}, Slots: map[string]int{}}
	for _, g := range p.RolloutGroups() {
		req.Members[g.Name] = append([]string(nil), g.Members...)
		req.Slots[g.Name] = g.MaxUnavailable
	}
	return req
}

// FinishHost ends this host's disruption once it is over: when it holds a host permit in
// group that is not a drain (agent drain --undo ends those) and, if it recorded a reboot,
// it runs in another boot than the one it rebooted from, verify (the driver loaded,
// every server serving) is asked, and the permit released when it says yes. It reports
// whether a permit was released; a permit whose reboot has not happened yet (the agent
// restarted before it) is left to the reboot, and reported as pending.
func FinishHost(ctx context.Context, c *coord.Client, group, bootID string, verify func(context.Context, coord.HostPermit) error) (released bool, pending *coord.HostPermit, err error) {
	p, err := c.MyHostPermit(ctx, group)
	if err != nil || p == nil {
		return false, nil, err
	}
	switch {
	case p.Cause == "drain":
		return false, p, nil
	case p.RebootID != "" && p.RebootID == bootID:
		return false, p, nil
	}
	if p.State != coord.HostVerifying {
		if err := c.UpdateHost(ctx, group, func(hp *coord.HostPermit) { hp.State = coord.HostVerifying }); err != nil {
			return false, p, err
		}
	}
	if err := verify(ctx, *p); err != nil {
		return false, p, fmt.Errorf("host %s keeps its host permit (%s): %w", c.Host(), p, err)
	}
	if err := c.ReleaseHost(ctx, group); err != nil {
		return false, p, err
	}
	return true, nil, nil
}

// OpenCommand connects a command (agent drain) to the fleet with a lease of its own, not
// agent run's (no lease file: Close revokes it, and a host permit does not live on it),
// and waits up to wait for the lease to be live: a host permit is taken only under one.
func OpenCommand(ctx context.Context, c *plans.Coordination, log *slog.Logger, wait time.Duration) (*coord.Client, error) {
	cl, err := coord.Open(configOf(c, log))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		_, _, _, err := cl.LeaseState()
		if err == nil {
			return cl, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cl.Close()
			return nil, fmt.Errorf("etcd %s: no lease within %s: %w (check that etcd runs: etcdctl endpoint health)", strings.Join(c.Etcd, ","), wait, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}
