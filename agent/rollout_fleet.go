package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/plans"
)

// Rollouts across hosts. A plan's rollout group may span hosts that each run their own
// agent (agent { coordination }): the members on this host are counted here as always,
// and the members elsewhere by a PermitSource, which the engine only asks and tells. It
// knows nothing of how the source counts (internal/fleet does it over etcd).

// PermitSource counts a rollout group's members on other hosts.
type PermitSource interface {
	// Take takes a permit for this host's member addr to carry out action, if at most
	// slots-1 members of the group are unavailable on other hosts and the group is not
	// stopped there. A non-nil error refuses the disruption: a *FleetRefusal, or why the
	// fleet cannot be asked (then nothing may be disrupted either).
	Take(ctx context.Context, group, addr, action string, slots int) error
	// Mark says addr counts as unavailable without asking (found down, a disruption
	// resumed after a restart of the agent, a failure): the others count it at once.
	Mark(group, addr, why string)
	// Fail says addr's step failed: the group stops on every host until addr is released.
	Fail(group, addr, reason string)
	// Release says addr was verified converged: its permit or mark goes, and so does a
	// stop it caused.
	Release(addr string)
	// Keep says which of this host's members are in rollout groups now: what the fleet
	// holds for any other (its block left the plan or its group) goes.
	Keep(addrs []string)
	// Changed is closed when a count of the fleet may have changed.
	Changed() <-chan struct{}
}

// FleetRefusal is a PermitSource's "not now".
type FleetRefusal struct {
	// Stopped: Cause on Host failed with Reason, and the group stopped there.
	Stopped             bool
	Host, Cause, Reason string
	// Holders describe the unavailable members elsewhere ("server.qwen on kpro6
	// (restart not verified yet)").
	Holders []string
}

func (r *FleetRefusal) Error() string {
	if r.Stopped {
		return fmt.Sprintf("stopped: %s failed on %s: %s", r.Cause, r.Host, r.Reason)
	}
	return strings.Join(r.Holders, ", ")
}

// UseFleet makes the permits count the members of other hosts through src (nil: this
// host's alone). Set it before the first engine uses r.
func (r *Rollouts) UseFleet(src PermitSource) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fleet = src
	if r.groupName == nil {
		r.groupName = map[string]string{}
	}
}

// Changed is closed when a count may have changed, here or (with a fleet) elsewhere: the
// reconcile loop tries its waiting members again then.
func (r *Rollouts) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fleet == nil {
		return r.changed
	}
	local, remote := r.changed, r.fleet.Changed()
	out := make(chan struct{})
	go func() {
		select {
		case <-local:
		case <-remote:
		}
		close(out)
	}()
	return out
}

// InFlight lists the members this host has in flight (disrupted, not verified yet), for
// status summaries.
func (r *Rollouts) InFlight() map[string]InFlightMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]InFlightMember{}
	if r.load() != nil {
		return out
	}
	for a, m := range r.inFlight {
		out[a] = InFlightMember{Group: m.Group, Action: m.Action, Since: m.Since, Failed: m.Failed}
	}
	return out
}

// setGroups records each member's group name, for the marks a fleet is told (New). A
// name is never forgotten here: an engine whose plan is then rejected must not make the
// running one's members unknown; prune says what left.
func (r *Rollouts) setGroups(groupOf map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.groupName == nil {
		r.groupName = map[string]string{}
	}
	for a, g := range groupOf {
		r.groupName[a] = g
	}
}

// keepFleet tells the fleet which members are in the plan's groups (under r.mu; prune).
func (r *Rollouts) keepFleet(members map[string]*plans.RolloutGroup) {
	if r.fleet == nil {
		return
	}
	addrs := make([]string, 0, len(members))
	for a := range members {
		addrs = append(addrs, a)
	}
	r.fleet.Keep(addrs)
}

// tellFleet tells the fleet what addr now is for the others (under r.mu): unavailable
// while in flight or observed down, else nothing.
func (r *Rollouts) tellFleet(addr string) {
	g := r.groupName[addr]
	if r.fleet == nil || g == "" {
		return
	}
	if m, ok := r.inFlight[addr]; ok {
		why := m.Action + " not verified yet"
		if m.Failed != "" {
			why = "failed: " + m.Failed
		}
		r.fleet.Mark(g, addr, why)
		return
	}
	if why, seen := r.seen[addr]; seen && why != "" {
		r.fleet.Mark(g, addr, why)
		return
	}
	if _, seen := r.seen[addr]; seen {
		r.fleet.Release(addr)
	}
}

// takeFleet asks the fleet for addr's permit once this host's own count allows it
// (slots left); a refusal is returned as the group's RolloutError. r.mu is held on entry
// and on return, released while the fleet is asked (admitMu keeps admits in order).
func (r *Rollouts) takeFleet(ctx context.Context, g string, max int, addr string, act Action, slots int, blockers []blocker) *RolloutError {
	src := r.fleet
	r.mu.Unlock()
	err := src.Take(ctx, g, addr, string(act), slots)
	r.mu.Lock()
	if err == nil {
		return nil
	}
	var fr *FleetRefusal
	if errors.As(err, &fr) && fr.Stopped {
		return &RolloutError{Group: g, Max: max, Stopped: true, Cause: fr.Cause, Host: fr.Host, Reason: fr.Reason}
	}
	if errors.As(err, &fr) {
		for _, h := range fr.Holders {
			blockers = append(blockers, blocker{addr: h, remote: true})
		}
	} else {
		blockers = append(blockers, blocker{addr: "coordination", why: err.Error() + "; nothing is disrupted until etcd answers", remote: true})
	}
	return &RolloutError{Group: g, Max: max, blockers: blockers}
}

// remote reports whether the refusal waits on something beyond this host.
func (e *RolloutError) remote() bool {
	for _, b := range e.blockers {
		if b.remote {
			return true
		}
	}
	return e.Host != ""
}

// InFlightMember is a member this host disrupted and has not verified yet.
type InFlightMember struct {
	Group, Action string
	Since         time.Time
	// Failed quotes its step's failure: the group stopped there.
	Failed string
}

// fleetPoll is when an apply waiting for other hosts asks again even without news: an
// etcd that came back may not say so.
func fleetPoll(r *Rollouts) <-chan time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fleet == nil {
		return nil
	}
	return time.After(2 * time.Second)
}
