package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/drain"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources/registry"
)

// drain is `agent drain [--reason TEXT]`: with coordination, take the host permit
// (refused, the holder named, when the host group has none free); record the drain (agent
// run and apply hold the servers from then on); stop every server, verified, through the
// stopper a driver change uses. `agent drain --undo` relaunches them, verified, and
// releases the permit once they serve.
func (inv *invocation) drain(ctx context.Context, store *state.Store) int {
	if inv.o.undo {
		return inv.undrain(ctx, store)
	}
	p, m := inv.p, registry.Machine()
	rec := drain.Record{Reason: inv.o.reason, Since: time.Now().UTC(), By: operator()}
	var c *coord.Client
	if cfg := p.Agent.Coordination; cfg != nil {
		detail := "agent drain by " + rec.By
		if rec.Reason != "" {
			detail += ": " + rec.Reason
		}
		var err error
		c, err = inv.takeDrainPermit(ctx, detail, "try again once it is released (agent status --fleet shows it)")
		if err != nil {
			return inv.fail(err)
		}
		defer c.Close()
		rec.Group = cfg.HostDisruptions.Group
	}
	if err := drain.Write(store.Dir(), rec); err != nil {
		return inv.fail(err)
	}
	lock, daemonRuns, err := inv.drainLock(ctx, store)
	if err != nil {
		return inv.fail(fmt.Errorf("the host is recorded drained (agent run relaunches nothing), but its servers are not stopped: %w; run agent drain again", err))
	}
	if lock != nil {
		defer lock.Release()
	}
	servers, _ := store.View().List("server")
	stop := func() error { return m.StopGPUServers.StopGPUServers(ctx, store.View(), nil, "agent drain") }
	err = stop()
	if err == nil && daemonRuns {
		// agent run holds the state: its steps ask the drain record before they act, but
		// one already past that question may still launch; a second stop, after it,
		// catches that launch.
		time.Sleep(3 * time.Second)
		err = stop()
	}
	if err != nil {
		// As a driver change's failed stop: recorded in the permit (what failed, not
		// this command's advice), it stops the host group fleet-wide (agent status
		// --fleet names it) until this host is undrained or its drain, retried, stops
		// them all.
		return inv.fail(inv.recordFailed(ctx, coord.StepStop, fmt.Errorf("not every server stopped: %w", err),
			fmt.Errorf("drained, but not every server stopped: %w; run agent drain again, or agent drain --undo", err)))
	}
	if c != nil {
		if err := c.UpdateHost(ctx, rec.Group, func(hp *coord.HostPermit) {
			hp.State = coord.HostDrained
			if hp.Failure != nil && hp.Failure.Step == coord.StepStop {
				hp.Failure = nil // an earlier drain's stop failed; this one stopped them all
			}
		}); err != nil {
			return inv.fail(err)
		}
	}
	fmt.Fprintf(inv.stdout, "Drained: %d servers stopped and verified gone (%s).", len(servers), strings.Join(servers, ", "))
	if rec.Group != "" {
		fmt.Fprintf(inv.stdout, " This host holds a host permit of group %s.", rec.Group)
	}
	fmt.Fprintln(inv.stdout, " agent drain --undo relaunches them.")
	return ExitOK
}

// recordFailed records step's failure (cause) in the host permit this drain took, as
// the driver's steps do (nothing without one), and returns err, what the command says,
// with why the record failed if it did.
func (inv *invocation) recordFailed(ctx context.Context, step string, cause, err error) error {
	if ferr := inv.gate.Failed(ctx, step, cause); ferr != nil {
		return fmt.Errorf("%w (and the failure is not recorded in its host permit: %v)", err, ferr)
	}
	return err
}

// takeDrainPermit connects to the fleet under a lease of its own (a host permit is not
// bound to it) and takes this host's host permit for a drain, or finds the one it holds.
// A refusal (the group full with other hosts, named) says it and then after.
func (inv *invocation) takeDrainPermit(ctx context.Context, detail, after string) (*coord.Client, error) {
	c, err := fleet.OpenCommand(ctx, inv.p.Agent.Coordination, inv.log, 10*time.Second)
	if err != nil {
		return nil, err
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.TakeHost(tctx, fleet.HostRequest(inv.p, "drain", detail, registry.Machine().BootID()))
	cancel()
	var ref *coord.HostRefusal
	if errors.As(err, &ref) {
		err = fmt.Errorf("refused: %w; %s", err, after)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	inv.gate.Attach(c, inv.p) // a failed step is recorded in the permit through it
	return c, nil
}

// undrain is `agent drain --undo`: with coordination, the host permit held first (the
// drain's own, or a free one taken again when an operator freed it with agent fleet
// release meanwhile; refused, the drain record kept, while other hosts fill the group),
// the drain record removed, every server of the plan applied (relaunched, ready,
// settled, smoke-tested as the plan says), then the permit released, only once they all
// serve.
func (inv *invocation) undrain(ctx context.Context, store *state.Store) int {
	p := inv.p
	var servers []string
	for _, r := range p.Resources {
		if strings.HasPrefix(r.Addr, "server.") {
			servers = append(servers, r.Addr)
		}
	}
	lock, daemonRuns, err := inv.drainLock(ctx, store)
	if err != nil {
		return inv.fail(err)
	}
	if lock != nil {
		defer lock.Release()
	}
	var c *coord.Client
	if cfg := p.Agent.Coordination; cfg != nil {
		c, err = inv.takeDrainPermit(ctx, "agent drain --undo by "+operator(),
			"the host stays drained (its servers down, the drain record kept): run agent drain --undo again once it is released "+
				"(agent status --fleet shows the holders; agent fleet release HOST PLAN frees a host that does not come back)")
		if err != nil {
			return inv.fail(err)
		}
		defer c.Close()
		if err := c.UpdateHost(ctx, cfg.HostDisruptions.Group, func(hp *coord.HostPermit) { hp.State = coord.HostVerifying }); err != nil {
			return inv.fail(err)
		}
	}
	if err := drain.Remove(store.Dir()); err != nil {
		return inv.fail(err)
	}
	var rep *agent.Report
	if len(servers) > 0 {
		eng, err := agent.New(p, inv.kinds, store, agent.Options{Targets: servers, Log: inv.log, Parallelism: inv.o.parallelism,
			StepContext: stopProgress("apply", false, inv.human), Probe: true})
		if err != nil {
			return inv.fail(err)
		}
		if daemonRuns {
			rep = awaitServing(ctx, eng, inv.stdout)
		} else {
			rep = eng.Apply(ctx, inv.human.ApplyEvent)
			inv.human.ApplySummary(rep)
		}
	}
	if rep != nil && rep.Failed() {
		err := errors.New("the servers do not all serve: the host keeps its host permit (if any); fix them and run agent drain --undo again")
		// A relaunch that failed fails the host's verification, as after a driver
		// change's reboot: recorded in the permit, it stops the host group.
		var vf *fleet.VerifyFailure
		if verr := fleet.Judge(rep, inv.red, nil); errors.As(verr, &vf) {
			err = inv.recordFailed(ctx, coord.StepVerify, vf.Err, err)
		}
		return inv.fail(err)
	}
	if cfg := p.Agent.Coordination; cfg != nil {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := c.ReleaseHost(rctx, cfg.HostDisruptions.Group); err != nil {
			return inv.fail(fmt.Errorf("the servers serve, but the host permit is not released: %w; run agent drain --undo again", err))
		}
	}
	fmt.Fprintf(inv.stdout, "Undrained: %d servers serve again.\n", len(servers))
	return ExitOK
}

// drainLock takes the state lock for agent drain, unless agent run holds it (for its
// life): then the drain goes on beside it (daemonRuns), which the drain record steers.
func (inv *invocation) drainLock(ctx context.Context, store *state.Store) (lock *state.Lock, daemonRuns bool, err error) {
	cmd := "agent drain " + inv.planArg
	lock, err = store.Acquire(ctx, inv.o.lockTimeout, cmd)
	if err == nil {
		return lock, false, nil
	}
	if daemonRefusal("drain", inv.planArg, inv.o, err) != nil {
		return nil, true, nil
	}
	return nil, false, err
}

// awaitServing waits (at most drainServeWait) until agent run relaunched every server of
// eng and each serves (ready, settled, smoke-tested: eng probes), printing where they
// stand every 10 s. The last status is returned: failed when they do not all serve.
func awaitServing(ctx context.Context, eng *agent.Engine, w io.Writer) *agent.Report {
	deadline := time.Now().Add(drainServeWait)
	var told time.Time
	for {
		rep := eng.Status(ctx)
		if !rep.Degraded() && !rep.Failed() {
			return rep
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if !rep.Failed() {
				rep.Steps[0].Err = fmt.Errorf("not serving after %s", drainServeWait)
			}
			return rep
		}
		if time.Since(told) >= 10*time.Second {
			fmt.Fprintf(w, "Waiting for agent run to relaunch the servers...\n")
			told = time.Now()
		}
		time.Sleep(time.Second)
	}
}

// drainServeWait bounds agent drain --undo's wait for agent run's relaunches.
const drainServeWait = 15 * time.Minute
