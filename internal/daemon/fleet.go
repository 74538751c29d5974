package daemon

import (
	"context"
	"reflect"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
)

// joinFleet joins the fleet when the plan says agent { coordination }: the rollout
// permits count the other hosts' members through etcd, the members waiting for them are
// queued again whenever the fleet's permits change, and this host's status summary is
// published under the lease. Without the block it does nothing. The returned function
// leaves the fleet (after the steps in flight have ended). A change of the block takes
// effect at the next start of the agent.
func (d *Daemon) joinFleet(ctx context.Context) (func(), error) {
	d.mu.Lock()
	cfg, rollouts, store := d.plan.Agent.Coordination, d.rollouts, d.store
	d.mu.Unlock()
	if cfg == nil {
		return func() {}, nil
	}
	c, err := fleet.Open(cfg, d.log, store.Dir())
	if err != nil {
		return nil, err
	}
	permits := fleet.NewPermits(c, d.log)
	if rollouts != nil {
		rollouts.UseFleet(permits)
	}
	d.log.Info("coordination: joined the fleet", "etcd", cfg.Etcd, "prefix", cfg.Prefix, "host", c.Host(), "lease", cfg.Lease)
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{}, 3)
	d.mu.Lock()
	plan := d.plan
	d.mu.Unlock()
	d.cfg.HostGate.Attach(c, plan)
	go func() {
		defer func() { done <- struct{}{} }()
		d.finishHost(ctx, c, cfg.HostDisruptions.Group)
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		fleet.Publish(ctx, c, d.log, func() fleet.Summary {
			rep, p := d.report()
			var secrets []string
			if p != nil {
				secrets = p.Secrets()
			}
			var inFlight map[string]agent.InFlightMember
			if rollouts != nil {
				inFlight = rollouts.InFlight()
			}
			return fleet.SummaryOf(c.Host(), d.cfg.Version, rep, inFlight, view.NewRedactor(secrets))
		})
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		d.wakeOnFleet(ctx, rollouts)
	}()
	return func() {
		cancel()
		<-done
		<-done
		<-done
		d.cfg.HostGate.Attach(nil, nil)
		fleet.Leave(c, permits)
	}, nil
}

// warnCoordination logs a reloaded plan whose coordination block differs from the one the
// loop joined the fleet with: it takes effect at the agent's next start, and the loop
// goes on with the fleet it has.
func (d *Daemon) warnCoordination(p *plans.Plan) {
	d.mu.Lock()
	old, running := d.plan, d.running
	d.mu.Unlock()
	if old == nil || !running || reflect.DeepEqual(coordinationOf(old), coordinationOf(p)) {
		return
	}
	d.log.Warn("the plan's agent { coordination } changed: it takes effect when the agent restarts (systemctl restart agent); the loop goes on with the fleet it joined")
}

// coordinationOf is the block without its source position.
func coordinationOf(p *plans.Plan) *plans.Coordination {
	if p.Agent.Coordination == nil {
		return nil
	}
	c := *p.Agent.Coordination
	c.DeclRange = hcl.Range{}
	return &c
}

// wakeOnFleet queues the members that wait for their rollout group whenever a count may
// have changed (another host's permit came or went, the lease came back).
func (d *Daemon) wakeOnFleet(ctx context.Context, r *agent.Rollouts) {
	if r == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.Changed():
		}
		d.mu.Lock()
		for addr, rs := range d.res {
			if rs.step != nil && fleet.Waits(rs.step.Err) {
				d.queue.Add(addr)
			}
		}
		d.mu.Unlock()
		select { // a burst of changes wakes them once
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}
