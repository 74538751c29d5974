package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Permit is a member of a rollout group that counts against its limit: disrupted by its
// agent (it took a permit) or down.
type Permit struct {
	Group string `json:"group"`
	Host  string `json:"host"`
	// Member is the resource's address on its host.
	Member string `json:"member"`
	// State is "disrupting" (a permit taken for a restart, replace or delete), "down"
	// (found down: it counts without asking) or "failed" (its step failed).
	State  string    `json:"state"`
	Action string    `json:"action"`
	Why    string    `json:"why"`
	Since  time.Time `json:"since"`
	// Confirmed is when its host last wrote it (Acquire, Hold): a host whose lease became
	// live again after that (etcd returned) has not confirmed it since.
	Confirmed time.Time `json:"confirmed"`
	// Unconfirmed is set by the fleet's view: its host's lease became live again after
	// Confirmed, and the host has not written it since.
	Unconfirmed bool `json:"unconfirmed"`
	// Revision is the permit's create revision: its fencing token.
	Revision int64 `json:"revision"`
}

// Permit states.
const (
	Disrupting = "disrupting"
	Down       = "down"
	Failed     = "failed"
)

func (p Permit) String() string {
	what := p.State
	switch {
	case p.Why != "":
		what = p.Why
	case p.Action != "":
		what = p.Action + " not verified yet"
	}
	if p.Unconfirmed {
		what += "; unconfirmed since etcd returned"
	}
	return fmt.Sprintf("%s on %s (%s)", p.Member, p.Host, what)
}

// Stop marks a group stopped by a failed member until that member is verified again.
type Stop struct {
	Group  string    `json:"group"`
	Host   string    `json:"host"`
	Member string    `json:"member"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
}

// Refusal is Acquire's "not now": the group is stopped, or at its limit.
type Refusal struct {
	Group   string
	Slots   int
	Holders []Permit
	Stop    *Stop
}

func (r *Refusal) Error() string {
	if r.Stop != nil {
		return fmt.Sprintf("rollout %s stopped: %s failed (host %s): %s", r.Group, r.Stop.Member, r.Stop.Host, r.Stop.Reason)
	}
	var hs []string
	for _, h := range r.Holders {
		hs = append(hs, h.String())
	}
	return fmt.Sprintf("rollout %s: %d unavailable on other hosts, %d allowed: %s", r.Group, len(r.Holders), r.Slots, strings.Join(hs, ", "))
}

func (c *Client) groupPrefix(group string) string { return c.cfg.Prefix + "/rollouts/" + group + "/" }
func (c *Client) guardKey(group string) string    { return c.groupPrefix(group) + "guard" }
func (c *Client) stopKey(group string) string     { return c.groupPrefix(group) + "stopped" }
func (c *Client) permitKey(group, member string) string {
	return c.groupPrefix(group) + "permits/" + c.cfg.Host + "/" + member
}

// Acquire takes a permit for member (on this host) to be disrupted by action, if fewer
// than slots members of the group's other permits exist (the caller has already counted
// what it knows itself: slots is what is left) and the group is not stopped. A member
// that already holds a permit keeps it. It returns the permit's revision, a *Refusal, or
// the error that kept it from asking (ErrNoLease, an *Epoch fence, etcd unreachable):
// only a nil error allows the disruption.
func (c *Client) Acquire(ctx context.Context, group, member, action string, slots int) (int64, error) {
	key := c.permitKey(group, member)
	for attempt := 0; ; attempt++ {
		lease, err := c.live(c.margin())
		if err != nil {
			return 0, err
		}
		resp, err := c.cli.Get(ctx, c.groupPrefix(group), clientv3.WithPrefix())
		if err != nil {
			return 0, fmt.Errorf("etcd: %w", err)
		}
		var guardRev int64
		var holders []Permit
		var stop *Stop
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			switch {
			case k == c.guardKey(group):
				guardRev = kv.ModRevision
			case k == c.stopKey(group):
				stop = &Stop{}
				if json.Unmarshal(kv.Value, stop) != nil {
					stop.Reason, stop.Member = "unreadable stop marker "+k, "?"
				}
			case k == key:
			case strings.HasPrefix(k, c.groupPrefix(group)+"permits/"):
				holders = append(holders, decodePermit(kv.Value, kv.CreateRevision, k))
			}
		}
		if stop != nil {
			return 0, &Refusal{Group: group, Slots: slots, Stop: stop}
		}
		hosts, err := c.disruptedHosts(ctx, group) // hostpermit.go: their servers are down
		if err != nil {
			return 0, err
		}
		holders = append(holders, hosts...)
		if len(holders) >= slots {
			return 0, &Refusal{Group: group, Slots: slots, Holders: holders}
		}
		now := time.Now().UTC()
		val := c.encode(Permit{Group: group, Host: c.cfg.Host, Member: member, State: Disrupting, Action: action, Since: now, Confirmed: now})
		tx, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(c.guardKey(group)), "=", guardRev),
			clientv3.Compare(clientv3.ModRevision(c.stopKey(group)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(c.fenceKey()), "=", 0), // no new epoch's fence
		).Then(
			clientv3.OpPut(key, val, clientv3.WithLease(lease)),
			clientv3.OpPut(c.guardKey(group), member+"@"+c.cfg.Host),
			clientv3.OpGet(key),
		).Commit()
		if err != nil {
			return 0, fmt.Errorf("etcd: %w", err)
		}
		if tx.Succeeded {
			return c.track(key, tx), nil
		}
		if e, err := c.Fence(ctx); err != nil || e != nil {
			if err != nil {
				return 0, err
			}
			return 0, e
		}
		if attempt >= 20 {
			return 0, errors.New("etcd: the group's permits kept changing during 20 attempts")
		}
	}
}

// track records the create revision of a key this client just wrote (the last response
// of tx is a Get of it) and returns it.
func (c *Client) track(key string, tx *clientv3.TxnResponse) int64 {
	rs := tx.Responses
	if len(rs) == 0 {
		return 0
	}
	kvs := rs[len(rs)-1].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.revs[key] = kvs[0].CreateRevision
	return kvs[0].CreateRevision
}

func (c *Client) encode(p any) string {
	b, _ := json.Marshal(p)
	return string(b)
}

func decodePermit(v []byte, rev int64, key string) Permit {
	var p Permit
	if json.Unmarshal(v, &p) != nil {
		p = Permit{Member: key, State: Down, Why: "unreadable permit"}
	}
	p.Revision = rev
	return p
}

// Hold records member (on this host) as unavailable without asking: it is down already
// (state Down or Failed), or resumes a disruption this host recorded before (Disrupting).
// The key is bound to the lease; a live lease is all it needs.
func (c *Client) Hold(ctx context.Context, group, member, state, action, why string) error {
	lease, err := c.live(0)
	if err != nil {
		return err
	}
	key := c.permitKey(group, member)
	now := time.Now().UTC()
	val := c.encode(Permit{Group: group, Host: c.cfg.Host, Member: member, State: state, Action: action, Why: why, Since: now, Confirmed: now})
	tx, err := c.cli.Txn(ctx).Then(
		clientv3.OpPut(key, val, clientv3.WithLease(lease)),
		clientv3.OpPut(c.guardKey(group), member+"@"+c.cfg.Host),
		clientv3.OpGet(key),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	c.track(key, tx)
	return nil
}

// Release deletes member's permit, only while it is the one this client wrote (same
// revision): a permit that expired with a lapsed lease is never someone else's to drop.
// Releasing a member without a permit does nothing.
func (c *Client) Release(ctx context.Context, group, member string) error {
	key := c.permitKey(group, member)
	c.mu.Lock()
	rev, ok := c.revs[key]
	c.mu.Unlock()
	if !ok {
		// Not written by this process: a permit an earlier process of this host left
		// (its lease may still run) is this host's member all the same.
		resp, err := c.cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("etcd: %w", err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		rev = resp.Kvs[0].CreateRevision
	}
	_, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).Then(
		clientv3.OpDelete(key),
		clientv3.OpPut(c.guardKey(group), "-"+member+"@"+c.cfg.Host),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	c.mu.Lock()
	if c.revs[key] == rev {
		delete(c.revs, key)
	}
	c.mu.Unlock()
	return nil
}

// Fail stops the group fleet-wide: member (on this host) failed with reason. A group
// already stopped by another member keeps that stop.
func (c *Client) Fail(ctx context.Context, group, member, reason string) error {
	val := c.encode(Stop{Group: group, Host: c.cfg.Host, Member: member, Reason: reason, Since: time.Now().UTC()})
	_, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(c.stopKey(group)), "=", 0)).Then(
		clientv3.OpPut(c.stopKey(group), val),
		clientv3.OpPut(c.guardKey(group), "stop "+member+"@"+c.cfg.Host),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}

// Unstop lifts the group's stop if member (on this host) caused it: it was verified
// again.
func (c *Client) Unstop(ctx context.Context, group, member string) error {
	resp, err := c.cli.Get(ctx, c.stopKey(group))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	var s Stop
	if json.Unmarshal(resp.Kvs[0].Value, &s) == nil && (s.Host != c.cfg.Host || s.Member != member) {
		return nil
	}
	_, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(c.stopKey(group)), "=", resp.Kvs[0].ModRevision)).Then(
		clientv3.OpDelete(c.stopKey(group)),
		clientv3.OpPut(c.guardKey(group), "unstop "+member+"@"+c.cfg.Host),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}

// Group is a rollout group as etcd has it.
type Group struct {
	Name    string   `json:"group"`
	Permits []Permit `json:"permits"`
	Stop    *Stop    `json:"stopped"`
}

// Rollouts reads every rollout group of the fleet, by name.
func (c *Client) Rollouts(ctx context.Context) ([]Group, error) {
	base := c.cfg.Prefix + "/rollouts/"
	resp, err := c.cli.Get(ctx, base, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	byName := map[string]*Group{}
	get := func(name string) *Group {
		if byName[name] == nil {
			byName[name] = &Group{Name: name, Permits: []Permit{}}
		}
		return byName[name]
	}
	for _, kv := range resp.Kvs {
		name, rest, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), base), "/")
		if !ok {
			continue
		}
		switch {
		case rest == "stopped":
			s := &Stop{}
			if json.Unmarshal(kv.Value, s) != nil {
				s.Reason = "unreadable stop marker"
			}
			get(name).Stop = s
		case strings.HasPrefix(rest, "permits/"):
			g := get(name)
			g.Permits = append(g.Permits, decodePermit(kv.Value, kv.CreateRevision, string(kv.Key)))
		}
	}
	var out []Group
	for _, g := range byName {
		if len(g.Permits) == 0 && g.Stop == nil {
			continue // only its guard is left: nothing in flight
		}
		sort.Slice(g.Permits, func(i, j int) bool { return g.Permits[i].Revision < g.Permits[j].Revision })
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
