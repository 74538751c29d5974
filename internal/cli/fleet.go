package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
)

// applyFleet is an apply's part in the fleet when the plan joins one (agent {
// coordination }): a lease of its own (the state directory's lease file, as agent run's;
// ended by leave), the same etcd rollout permits as agent run when the plan has rollout
// groups, and the driver kind's host gate attached: a driver replace takes the host
// permit first, and waits (at most hostPermitWait, the holder named) while the group has
// none free. A host permit is not bound to the lease: it outlives the apply, through the
// reboot, until a run in another boot verified the host (finishHost).
type applyFleet struct {
	c        *coord.Client
	permits  *fleet.Permits
	rollouts *agent.Rollouts
	gate     *fleet.HostGate
	group    string
}

// hostPermitWait bounds an apply's wait for the fleet's host permit: an upgrade of the
// host before it (a reboot and its servers' relaunch) takes minutes.
const hostPermitWait = 30 * time.Minute

// joinForApply joins the fleet for an apply; nil (nothing of etcd touched) without
// coordination.
func joinForApply(p *plans.Plan, store *state.Store, log *slog.Logger, gate *fleet.HostGate) (*applyFleet, error) {
	cfg := p.Agent.Coordination
	if cfg == nil {
		return nil, nil
	}
	c, err := fleet.Open(cfg, log, store.Dir())
	if err != nil {
		return nil, err
	}
	j := &applyFleet{c: c, gate: gate, group: cfg.HostDisruptions.Group}
	if len(p.RolloutGroups()) > 0 {
		j.permits = fleet.NewPermits(c, log)
		j.rollouts = agent.NewRollouts(store)
		j.rollouts.UseFleet(j.permits)
	}
	gate.Attach(c, p)
	gate.WaitWhileHeld(hostPermitWait)
	return j, nil
}

func (j *applyFleet) rolloutsOf() *agent.Rollouts {
	if j == nil {
		return nil
	}
	return j.rollouts
}

// leave ends the apply's part in the fleet (its host permit, if any, stays).
func (j *applyFleet) leave() {
	if j == nil {
		return
	}
	j.gate.Attach(nil, nil)
	fleet.Leave(j.c, j.permits)
}

// finishHost ends this host's disruption after an apply, as agent run does at its start
// (fleet.FinishHost): in another boot than the one the host rebooted from, once the whole
// plan applied and every resource observes healthy, the host permit is released, and
// the apply says so (on stderr under --json: stdout is one document). A permit whose
// reboot is still to come is named; one that cannot be released says why. failed: the
// host's verification failed (recorded in the permit: the host group is stopped), which
// fails the apply.
func (inv *invocation) finishHost(ctx context.Context, eng *agent.Engine, rep *agent.Report) (failed bool) {
	j := inv.fleet
	if j == nil {
		return false
	}
	w := inv.stdout
	if inv.o.json {
		w = inv.stderr
	}
	// The apply's own failure (a server that did not serve again, a driver whose check
	// failed) fails the host's verification as it does under agent run: recorded in the
	// permit, it stops the host group fleet-wide until this host is verified or freed.
	verify := func(ctx context.Context, _ coord.HostPermit) error {
		switch {
		case len(inv.o.targets) > 0:
			return errors.New("--target applied part of the plan; run agent apply without --target")
		case rep.Failed():
			return fleet.Judge(rep, inv.red, nil)
		}
		// The status after the apply, each step with the apply's diff (a status reads no
		// diff): a driver the reboot did not help converged with nothing left to do and
		// says why in its warnings, a failure, not a resource still on its way.
		applied := map[string]*agent.Diff{}
		for _, a := range rep.Steps {
			applied[a.Addr] = a.Diff
		}
		st := eng.Status(ctx)
		for _, s := range st.Steps {
			if s.Diff == nil {
				s.Diff = applied[s.Addr]
			}
		}
		return fleet.Judge(st, inv.red, nil)
	}
	// Most applies hold no host permit: one short read, so that an etcd down costs an
	// apply seconds, not the verification's minutes.
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	held, err := j.c.MyHostPermit(qctx, j.group)
	cancel()
	if err != nil || held == nil {
		if err != nil {
			fmt.Fprintf(w, "Host permits of group %s not read: %s\n", j.group, inv.red.String(err.Error()))
		}
		return false
	}
	fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	released, pending, err := fleet.FinishHost(fctx, j.c, j.group, inv.bootID(), verify)
	switch {
	case released:
		fmt.Fprintf(w, "Host permit of group %s released: this host runs in a new boot and every resource of the plan is verified.\n", j.group)
	case errors.As(err, new(*fleet.VerifyFailure)):
		fmt.Fprintf(w, "Host permit of group %s: %s; recorded in it, this stops the host group fleet-wide until this host is verified "+
			"(fix it and run agent apply again) or freed (agent fleet release %s %s)\n", j.group, inv.red.String(err.Error()), j.c.Host(), inv.planArg)
		return true
	case err != nil:
		fmt.Fprintf(w, "Host permit of group %s: %s\n", j.group, inv.red.String(err.Error()))
	case pending != nil && pending.Cause != "drain":
		fmt.Fprintf(w, "This host holds a host permit of group %s (%s): it is released after the reboot, once every resource is verified (by agent run or agent apply).\n", j.group, pending)
	}
	return false
}

// fleetStatus is `agent status --fleet`: every host of the fleet, its resources' health
// and the rollouts in flight, from etcd alone. Exit 0 when every host is reachable and
// healthy and no rollout stopped, 3 otherwise, 1 when etcd cannot be read (then, with
// --hosts, each agent's own /status is shown instead, or why it cannot be read).
func fleetStatus(ctx context.Context, p *plans.Plan, asJSON bool, agents []string, stdout, stderr io.Writer, red *view.Redactor) int {
	fail := func(msg string) int {
		var st *fleet.Status
		if len(agents) > 0 && p.Agent.Coordination != nil {
			st = &fleet.Status{Prefix: p.Agent.Coordination.Prefix, Hosts: fleet.FromAgents(ctx, agents, red), Rollouts: []coord.Group{}, HostPermits: []coord.HostPermit{}}
		} else if p.Agent.Coordination != nil {
			msg += "; name the agents' metrics_listen addresses with --hosts ADDR,... to read each one's own /status"
		}
		if asJSON {
			view.WriteJSON(stdout, &fleet.Document{JSONOutput: view.ErrorJSON("status", red.String(msg)), Fleet: st})
			return ExitError
		}
		fmt.Fprintf(stderr, "agent status: %s\n", red.String(msg))
		if st != nil {
			fmt.Fprintf(stdout, "etcd cannot be read: each agent's last summary from its own /status (no rollout shown):\n")
			writeHosts(stdout, st, time.Now())
		}
		return ExitError
	}
	if p.Agent.Coordination == nil {
		return fail("--fleet: the plan has no agent { coordination { etcd = [...] } } block: this host is in no fleet")
	}
	c, err := fleet.Open(p.Agent.Coordination, nil, "")
	if err != nil {
		return fail(err.Error())
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := fleet.Read(rctx, c)
	if err != nil {
		hint := ""
		if errors.Is(err, context.DeadlineExceeded) {
			hint = " (no member answered within 10 s: check the endpoints, ca_file, cert_file and key_file, and that etcd runs: etcdctl endpoint health)"
		}
		return fail(fmt.Sprintf("--fleet: reading etcd %s: %v%s", strings.Join(p.Agent.Coordination.Etcd, ","), err, hint))
	}
	if asJSON {
		view.WriteJSON(stdout, fleet.NewDocument(st))
	} else {
		writeFleet(stdout, st, time.Now())
	}
	if st.Degraded() {
		return ExitDegraded
	}
	return ExitOK
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// writeFleet prints the fleet for people: one line per host, then the rollouts.
func writeFleet(w io.Writer, st *fleet.Status, now time.Time) {
	down := 0
	for _, h := range st.Hosts {
		if !h.Reachable {
			down++
		}
	}
	fmt.Fprintf(w, "Fleet %s: %d hosts", st.Prefix, len(st.Hosts))
	if down > 0 {
		fmt.Fprintf(w, ", %d unreachable", down)
	}
	fmt.Fprintln(w)
	writeHosts(w, st, now)
	writeHostPermits(w, st.HostPermits, now)
	if st.Epoch != nil {
		fmt.Fprintf(w, "New epoch: %s\n", st.Epoch.Error())
	}
	if len(st.Rollouts) == 0 {
		fmt.Fprintln(w, "No rollout in flight.")
		return
	}
	fmt.Fprintln(w, "Rollouts in flight:")
	for _, g := range st.Rollouts {
		if g.Stop != nil {
			fmt.Fprintf(w, "  %s: stopped since %s: %s failed on %s: %s\n", g.Name, g.Stop.Since.UTC().Format(time.RFC3339), g.Stop.Member, g.Stop.Host, firstLine(g.Stop.Reason))
		}
		for _, p := range g.Permits {
			fmt.Fprintf(w, "  %s: %s since %s (permit revision %d)\n", g.Name, p, p.Since.UTC().Format(time.RFC3339), p.Revision)
		}
	}
}

// writeHosts prints one line per host.
func writeHosts(w io.Writer, st *fleet.Status, now time.Time) {
	width := 0
	for _, h := range st.Hosts {
		width = max(width, len(h.Host))
	}
	for _, h := range st.Hosts {
		health := "no summary"
		if s := h.Summary; s != nil {
			ok := 0
			var bad []string
			for _, r := range s.Resources {
				if r.Healthy {
					ok++
					continue
				}
				why := r.Error
				if why == "" {
					why = r.Summary
				}
				bad = append(bad, r.Address+": "+firstLine(why))
			}
			health = fmt.Sprintf("%d/%d resources healthy", ok, len(s.Resources))
			if len(bad) > 0 {
				health += "; " + strings.Join(bad, "; ")
			}
		}
		state := "healthy"
		switch {
		case h.Error != "":
			state, health = "cannot read its /status", h.Error
		case h.From != "":
			state = "last known from " + h.From
		case !h.Reachable:
			state = fmt.Sprintf("unreachable since %s (%s ago; lease lapsed), last known", h.Updated.UTC().Format(time.RFC3339), now.Sub(h.Updated).Round(time.Second))
		case h.Summary == nil || !h.Summary.Healthy:
			state = "degraded"
		}
		fmt.Fprintf(w, "  %-*s  %s: %s\n", width, h.Host, state, health)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
