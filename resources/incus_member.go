package resources

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
)

// MemberWatchEvery is how often the watch of a container on a cluster member asks the
// cluster how that member stands. One GET of the member (the cluster's database answers
// it, from any member): negligible at idle.
const MemberWatchEvery = 5 * time.Second

// WatchMember blocks until the state of the cluster member holding instance changes
// from what the last watch of instance reported (nil): it falls from Online, or, once a
// watch reported it down, it is back or in another status (Offline to Evacuated). It
// asks every MemberWatchEvery, until ctx ends (its error). A member still down as
// reported is not reported again: `agent run` arms the watch after each reconcile,
// and a watch that returned every MemberWatchEvery for as long as a member stayed down
// meant a reconcile and a "change noticed" line every few seconds for the whole outage.
// agent.ErrNothingToWatch: the instance is on no cluster member (or the cluster cannot
// say which). The container kind's watch, and the server kind's of a server inside.
func WatchMember(ctx context.Context, env *agent.Env, c *incus.Client, instance string) error {
	member, err := c.InstanceMember(ctx, instance)
	if err != nil || member == "" || member == "none" {
		return agent.ErrNothingToWatch
	}
	key := MemberSeenKey(c, instance)
	t := time.NewTicker(MemberWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		m, err := memberState(ctx, c, member)
		if err != nil {
			continue
		}
		was, reported := env.Memory.Load(key)
		switch {
		case m.Online() && reported:
			env.Memory.Delete(key)
			env.Log.Info("the instance's cluster member is online again; observing it now", "instance", instance, "member", member, "was", was)
			return nil
		case !m.Online() && was != m.Status:
			env.Memory.Store(key, m.Status)
			env.Log.Info("the instance's cluster member is not online; observing it now", "instance", instance, "member", member, "state", m.Describe())
			return nil
		}
	}
}

// MemberSeenKey names, in the loop's memory (agent.Memory), the status of the member
// holding instance that a watch last reported down, per Incus socket and instance: the
// watches of one resource come and go (one per reconcile, and a new engine at each plan
// reload), what they reported must outlive them. An observation that finds the member
// online forgets it (MemberOnline; the server kind's observe itself, after DownMember).
func MemberSeenKey(c *incus.Client, instance string) string {
	return "incus member seen " + c.Socket() + "\x00" + instance
}

// memberState is the member as the cluster reports it, under a short deadline of its own
// (the member the agent talks to may itself be the one that hangs).
func memberState(ctx context.Context, c *incus.Client, member string) (*incus.ClusterMember, error) {
	ctx, cancel := context.WithTimeout(ctx, MemberWatchEvery)
	defer cancel()
	return c.ClusterMember(ctx, member)
}

// DownMember returns the member holding instance, and the cluster's word on it, when that
// member is not online; "" and nil otherwise (not on a cluster, online, or the cluster
// cannot tell). Asked before the instance itself: the cluster's database answers both
// from any member, while a read of the instance is forwarded to its member, and one
// whose incusd hangs never answers it (issue 27: a status that waited for the step's
// whole timeout). It only reads: the caller forgets what a watch reported of a member
// found online (MemberSeenKey).
func DownMember(ctx context.Context, c *incus.Client, instance string) (string, error) {
	member, err := c.InstanceMember(ctx, instance)
	if err != nil || member == "" || member == "none" {
		return "", nil
	}
	if err := memberOnline(ctx, c, member, instance); err != nil {
		return member, err
	}
	return "", nil
}

func ValidInstanceName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[len(s)-1] == '-' {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case (c >= '0' && c <= '9' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// InstanceMember is the cluster member an instance is on; "" outside a cluster (Incus
// says "none" there).
func InstanceMember(inst *incus.Instance) string {
	if inst.Location == "none" {
		return ""
	}
	return inst.Location
}

// MemberOnline returns an error naming the member and what the cluster says about it
// when it is not online (and, when it is, forgets in seen what a watch reported of it): its instances can be neither observed nor changed (the cluster
// answers an offline member's instance from its database, as stopped).
func MemberOnline(ctx context.Context, seen *agent.Memory, c *incus.Client, member, instance string) error {
	if err := memberOnline(ctx, c, member, instance); err != nil {
		return err
	}
	seen.Delete(MemberSeenKey(c, instance)) // online: a watch reports its next fall again
	return nil
}

// memberOnline is MemberOnline's read, which forgets nothing.
func memberOnline(ctx context.Context, c *incus.Client, member, instance string) error {
	m, err := c.ClusterMember(ctx, member)
	if err != nil {
		return ReachErr(c, fmt.Errorf("cluster member %s of instance %s: %w", member, instance, err))
	}
	if !m.Online() {
		return MemberDownErr(m, instance)
	}
	return nil
}

// ReachErr adds the fix to an error that is not an answer of Incus (no daemon at the
// socket, permission denied).
func ReachErr(c *incus.Client, err error) error {
	var ie *incus.Error
	if errors.As(err, &ie) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w (is incusd running and is %s its socket? set agent { incus_socket } or INCUS_SOCKET)", err, c.Socket())
}

// MemberDownErr is what a member the cluster reports not online means for an instance
// on it, with the fix.
func MemberDownErr(m *incus.ClusterMember, instance string) error {
	return agent.Unavailable(fmt.Errorf("%s: instance %s on it can be neither observed nor changed until it is back (incus cluster list; start its incusd, or evacuate and restore it)",
		m.Describe(), instance))
}
