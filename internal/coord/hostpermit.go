package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Host permits: a host disruption (every server of a host down: a driver replace, a
// reboot, agent drain) holds one of its host group's max_unavailable permits from before
// its first server stops until that host released it, verified again (after a reboot, in
// a new boot). Unlike a rollout permit it is not bound to the lease: a reboot outlasts any
// lease, and a host that never comes back must keep holding it (an operator frees it with
// agent fleet release, logged). Keys, under P/rollouts/@hosts/<group>/ (watched with the
// rollouts, so a change wakes whoever waits):
//
//	guard             bumped by every change of the group's host permits
//	holders/<host>    the host's permit (no lease)
//	released/<host>/<unix nano>  an operator's release: who, when, the permit freed
//
// Taking one also moves the guard of every rollout group the host has members in (and
// releasing it moves them again), so that a rollout permit counted before a host
// disruption began is never granted on that old count.

// HostPermit is a host's disruption as etcd has it.
type HostPermit struct {
	Group string `json:"group"`
	Host  string `json:"host"`
	// Cause is what disrupts the host ("driver", "drain", "reboot"), Detail says more
	// ("driver 580.95.05 → 590.48.01", a drain's reason).
	Cause  string `json:"cause"`
	Detail string `json:"detail,omitempty"`
	// State is where the disruption is: "stopping", "installing", "rebooting", "drained",
	// "verifying", or "failed" (a step failed: Failure says which).
	State string `json:"state"`
	// BootID is the boot the permit was taken in (RebootID, once the host recorded a
	// reboot, the boot it rebooted from): a host released after a reboot only in another.
	BootID   string `json:"boot_id"`
	RebootID string `json:"reboot_boot_id,omitempty"`
	// Since is when the permit was taken, Updated when the host last wrote it.
	Since   time.Time `json:"since"`
	Updated time.Time `json:"updated"`
	// Members are the host's servers by rollout group: each counts as down in its group
	// while the permit is held.
	Members map[string][]string `json:"members,omitempty"`
	// Failure is the step of this disruption that failed, until the host is verified
	// (it releases the permit) or an operator frees it: while it is set, the host group
	// is stopped fleet-wide (no other host takes a permit). Nil when none failed.
	Failure *HostFailure `json:"failure,omitempty"`
	// Revision is the permit's create revision.
	Revision int64 `json:"revision"`
}

// HostFailure is a failed step of a host disruption: the host, the step ("stop",
// "install", "reboot", "verify"), the error quoted, when, and in which boot.
type HostFailure struct {
	Step   string    `json:"step"`
	Error  string    `json:"error"`
	At     time.Time `json:"at"`
	BootID string    `json:"boot_id"`
}

// Host-permit states.
const (
	HostStopping   = "stopping"
	HostInstalling = "installing"
	HostRebooting  = "rebooting"
	HostDrained    = "drained"
	HostVerifying  = "verifying"
	HostFailed     = "failed"
)

// HostStates are the states a host permit is written in (docs/schema's enum, with
// "unreadable" for a permit that cannot be decoded).
var HostStates = []string{HostStopping, HostInstalling, HostRebooting, HostDrained, HostVerifying, HostFailed}

// The steps of a host disruption that can fail (HostFailure.Step).
const (
	StepStop    = "stop"    // stopping the host's servers (a driver change, agent drain)
	StepInstall = "install" // the driver's installer or package
	StepReboot  = "reboot"  // asking for the reboot
	StepVerify  = "verify"  // after the reboot: the driver and every server verified
)

// HostSteps are the steps a failure names (docs/schema's enum).
var HostSteps = []string{StepStop, StepInstall, StepReboot, StepVerify}

func (p HostPermit) String() string {
	return p.line(true)
}

// Headline is String without a failure's error (which a view quotes apart).
func (p HostPermit) Headline() string { return p.line(false) }

func (p HostPermit) line(quote bool) string {
	what := p.Cause
	if p.Detail != "" {
		what = p.Detail
	}
	var s string
	if f := p.Failure; f != nil {
		// The failure first: it is what stops the group.
		s = fmt.Sprintf("%s failed at %s", p.Host, f.Step)
		if quote {
			s += fmt.Sprintf(": %q", f.Error)
		}
		s += " since " + f.At.Local().Format("15:04")
		if p.State != HostFailed {
			what += "; now " + p.State
		}
	} else {
		s = fmt.Sprintf("%s %s since %s", p.Host, p.State, p.Since.Local().Format("15:04"))
	}
	if what != "" {
		s += " (" + strings.TrimPrefix(what, "; ") + ")"
	}
	return s
}

// HostRequest asks for this host's host permit.
type HostRequest struct {
	// Group is the host group, Max its max_unavailable.
	Group string
	Max   int
	// Cause, Detail and BootID as HostPermit has them.
	Cause, Detail, BootID string
	// Members are this host's servers by rollout group, Slots each group's
	// max_unavailable: a host disruption waits while other hosts have members of one of
	// these groups unavailable, unless they and these all fit in its limit.
	Members map[string][]string
	Slots   map[string]int
}

// HostRefusal is TakeHost's "not now": the host group is stopped by a host whose
// disruption failed (Failed), has no permit free (Holders hold them), or a rollout group
// these servers belong to has members down elsewhere (Rollout, Permits) or is stopped
// (Stop).
type HostRefusal struct {
	Group   string
	Max     int
	Holders []HostPermit
	Failed  *HostPermit
	Rollout string
	Permits []Permit
	Stop    *Stop
}

func (r *HostRefusal) Error() string {
	switch {
	case r.Failed != nil:
		f := r.Failed
		return fmt.Sprintf("host group %s is stopped: %s; fix %s (it resumes by itself once verified) or agent fleet release %s PLAN",
			r.Group, f, f.Host, f.Host)
	case r.Stop != nil:
		return fmt.Sprintf("host disruption: rollout %s stopped: %s failed (host %s): %s", r.Rollout, r.Stop.Member, r.Stop.Host, r.Stop.Reason)
	case r.Rollout != "":
		var ps []string
		for _, p := range r.Permits {
			ps = append(ps, p.String())
		}
		return fmt.Sprintf("host disruption: rollout %s has members unavailable on other hosts: %s", r.Rollout, strings.Join(ps, ", "))
	}
	var hs []string
	for _, h := range r.Holders {
		hs = append(hs, h.String()+fmt.Sprintf(", permit held %s", time.Since(h.Since).Round(time.Second)))
	}
	return fmt.Sprintf("host group %s: %d of %d host permits held: %s", r.Group, len(r.Holders), r.Max, strings.Join(hs, "; "))
}

func (c *Client) hostBase() string              { return c.cfg.Prefix + "/rollouts/@hosts/" }
func (c *Client) hostGuard(group string) string { return c.hostBase() + group + "/guard" }
func (c *Client) holderKey(group, host string) string {
	return c.hostBase() + group + "/holders/" + host
}

// TakeHost takes this host's permit in req.Group: only with a live lease (a host cut off
// from etcd disrupts nothing), outside a new epoch's fence, while fewer than req.Max other
// hosts hold one and no rollout group of req.Members has members down elsewhere beyond
// its slots. A permit this host already holds is returned as it is (a disruption
// resumed). It returns the permit, a *HostRefusal, or why it could not ask.
func (c *Client) TakeHost(ctx context.Context, req HostRequest) (*HostPermit, error) {
	key := c.holderKey(req.Group, c.cfg.Host)
	for attempt := 0; ; attempt++ {
		if _, err := c.live(c.margin()); err != nil {
			return nil, err
		}
		resp, err := c.cli.Get(ctx, c.hostBase()+req.Group+"/", clientv3.WithPrefix())
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		var guardRev int64
		var holders []HostPermit
		for _, kv := range resp.Kvs {
			k := string(kv.Key)
			switch {
			case k == c.hostGuard(req.Group):
				guardRev = kv.ModRevision
			case k == key:
				p := decodeHostPermit(kv)
				return &p, nil
			case strings.HasPrefix(k, c.hostBase()+req.Group+"/holders/"):
				holders = append(holders, decodeHostPermit(kv))
			}
		}
		for i := range holders {
			if holders[i].Failure != nil {
				// As a failed rollout member stops its group: whatever max_unavailable
				// allows, no other host starts until that one is verified or freed.
				return nil, &HostRefusal{Group: req.Group, Max: req.Max, Holders: holders, Failed: &holders[i]}
			}
		}
		if len(holders) >= req.Max {
			return nil, &HostRefusal{Group: req.Group, Max: req.Max, Holders: holders}
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(c.hostGuard(req.Group)), "=", guardRev),
			clientv3.Compare(clientv3.CreateRevision(c.fenceKey()), "=", 0),
		}
		for _, g := range sortedKeys(req.Members) {
			rev, refusal, err := c.rolloutRoom(ctx, g, len(req.Members[g]), req.Slots[g])
			if err != nil || refusal != nil {
				if refusal != nil {
					refusal.Group, refusal.Max = req.Group, req.Max
					return nil, refusal
				}
				return nil, err
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.guardKey(g)), "=", rev))
		}
		now := time.Now().UTC()
		val := c.encode(HostPermit{Group: req.Group, Host: c.cfg.Host, Cause: req.Cause, Detail: req.Detail, State: HostStopping,
			BootID: req.BootID, Since: now, Updated: now, Members: req.Members})
		ops := append([]clientv3.Op{clientv3.OpPut(key, val), clientv3.OpPut(c.hostGuard(req.Group), "take "+c.cfg.Host)},
			c.moveGuards(req.Members, "host "+c.cfg.Host)...)
		tx, err := c.cli.Txn(ctx).If(cmps...).Then(append(ops, clientv3.OpGet(key))...).Commit()
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		if tx.Succeeded {
			kvs := tx.Responses[len(tx.Responses)-1].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				return nil, errors.New("etcd: the host permit written is gone")
			}
			p := decodeHostPermit(kvs[0])
			return &p, nil
		}
		if e, err := c.Fence(ctx); err != nil || e != nil {
			if err != nil {
				return nil, err
			}
			return nil, e
		}
		if attempt >= 20 {
			return nil, errors.New("etcd: the host permits kept changing during 20 attempts")
		}
	}
}

// rolloutRoom reads rollout group g: its guard's revision, or a refusal when it is
// stopped or other hosts have members unavailable beyond what n more allow under slots.
func (c *Client) rolloutRoom(ctx context.Context, g string, n, slots int) (int64, *HostRefusal, error) {
	resp, err := c.cli.Get(ctx, c.groupPrefix(g), clientv3.WithPrefix())
	if err != nil {
		return 0, nil, fmt.Errorf("etcd: %w", err)
	}
	var rev int64
	var others []Permit
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		switch {
		case k == c.guardKey(g):
			rev = kv.ModRevision
		case k == c.stopKey(g):
			s := &Stop{}
			if json.Unmarshal(kv.Value, s) != nil {
				s.Reason = "unreadable stop marker"
			}
			return 0, &HostRefusal{Rollout: g, Stop: s}, nil
		case strings.HasPrefix(k, c.groupPrefix(g)+"permits/") && !strings.HasPrefix(k, c.groupPrefix(g)+"permits/"+c.cfg.Host+"/"):
			others = append(others, decodePermit(kv.Value, kv.CreateRevision, k))
		}
	}
	hosts, err := c.disruptedHosts(ctx, g)
	if err != nil {
		return 0, nil, err
	}
	others = append(others, hosts...)
	if len(others) > 0 && len(others)+n > slots {
		return 0, &HostRefusal{Rollout: g, Permits: others}, nil
	}
	return rev, nil, nil
}

// disruptedHosts lists, as permits of rollout group g, the members of g on other hosts
// that hold a host permit: a host under disruption counts as its servers down.
func (c *Client) disruptedHosts(ctx context.Context, g string) ([]Permit, error) {
	all, err := c.HostPermits(ctx)
	if err != nil {
		return nil, err
	}
	var out []Permit
	for _, hp := range all {
		if hp.Host == c.cfg.Host {
			continue
		}
		for _, m := range hp.Members[g] {
			out = append(out, Permit{Group: g, Host: hp.Host, Member: m, State: Down, Why: "host disruption: " + hp.String(),
				Since: hp.Since, Confirmed: hp.Updated, Revision: hp.Revision})
		}
	}
	return out, nil
}

func (c *Client) moveGuards(members map[string][]string, why string) []clientv3.Op {
	var ops []clientv3.Op
	for _, g := range sortedKeys(members) {
		ops = append(ops, clientv3.OpPut(c.guardKey(g), why))
	}
	return ops
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func decodeHostPermit(kv *mvccpb.KeyValue) HostPermit {
	var p HostPermit
	if json.Unmarshal(kv.Value, &p) != nil {
		p = HostPermit{Host: string(kv.Key), State: "unreadable"}
	}
	p.Revision = kv.CreateRevision
	return p
}

// MyHostPermit is this host's permit in group, nil when it holds none.
func (c *Client) MyHostPermit(ctx context.Context, group string) (*HostPermit, error) {
	resp, err := c.cli.Get(ctx, c.holderKey(group, c.cfg.Host))
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	p := decodeHostPermit(resp.Kvs[0])
	return &p, nil
}

// UpdateHost rewrites this host's permit in group through change (its state, the boot
// it reboots from): only while it is the same permit (same create revision). A permit
// freed meanwhile (agent fleet release) is an error: the disruption has no permit.
func (c *Client) UpdateHost(ctx context.Context, group string, change func(*HostPermit)) error {
	p, err := c.MyHostPermit(ctx, group)
	if err != nil {
		return err
	}
	if p == nil {
		return fmt.Errorf("host %s holds no host permit in group %s (freed by agent fleet release?)", c.cfg.Host, group)
	}
	change(p)
	p.Updated = time.Now().UTC()
	key := c.holderKey(group, c.cfg.Host)
	tx, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", p.Revision)).Then(
		clientv3.OpPut(key, c.encode(p)), clientv3.OpPut(c.hostGuard(group), "update "+c.cfg.Host)).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	if !tx.Succeeded {
		return fmt.Errorf("host %s: its host permit in group %s changed while it was written", c.cfg.Host, group)
	}
	return nil
}

// FailHost records in this host's permit in group that step of its disruption failed
// with reason (the group stops fleet-wide until the host is verified and releases the
// permit, or an operator frees it). The same step failing with the same reason again
// writes nothing (recorded reports whether it wrote): a loop that retries does not
// hammer etcd. A host that holds no permit has nothing to record. bootID is this boot's.
func (c *Client) FailHost(ctx context.Context, group, step, reason, bootID string) (recorded bool, err error) {
	p, err := c.MyHostPermit(ctx, group)
	if err != nil || p == nil {
		return false, err
	}
	if f := p.Failure; f != nil && f.Step == step && f.Error == reason && p.State == HostFailed {
		return false, nil
	}
	err = c.UpdateHost(ctx, group, func(hp *HostPermit) {
		hp.State, hp.Failure = HostFailed, &HostFailure{Step: step, Error: reason, At: time.Now().UTC(), BootID: bootID}
	})
	return err == nil, err
}

// ReleaseHost deletes this host's permit in group (done by the host once it is verified
// again); releasing none does nothing. It needs no lease.
func (c *Client) ReleaseHost(ctx context.Context, group string) error {
	p, err := c.MyHostPermit(ctx, group)
	if err != nil || p == nil {
		return err
	}
	return c.deleteHost(ctx, *p, "release "+c.cfg.Host)
}

func (c *Client) deleteHost(ctx context.Context, p HostPermit, why string, extra ...clientv3.Op) error {
	key := c.holderKey(p.Group, p.Host)
	ops := append([]clientv3.Op{clientv3.OpDelete(key), clientv3.OpPut(c.hostGuard(p.Group), why)}, c.moveGuards(p.Members, why)...)
	tx, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", p.Revision)).Then(append(ops, extra...)...).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	if !tx.Succeeded {
		return fmt.Errorf("host %s: its host permit in group %s changed while it was released; read it again", p.Host, p.Group)
	}
	return nil
}

// HostRelease is an operator's release of a host's permit (agent fleet release).
type HostRelease struct {
	Permit HostPermit `json:"permit"`
	By     string     `json:"by"`
	At     time.Time  `json:"at"`
	Reason string     `json:"reason,omitempty"`
}

// ForceReleaseHost frees host's permits (in every host group) for an operator, by who,
// and logs each release in etcd (under released/). It needs no lease. It returns the
// permits freed; none held is an error naming the holders.
func (c *Client) ForceReleaseHost(ctx context.Context, host, by, reason string) ([]HostPermit, error) {
	all, err := c.HostPermits(ctx)
	if err != nil {
		return nil, err
	}
	var freed []HostPermit
	var held []string
	for _, p := range all {
		if p.Host != host {
			held = append(held, p.Host+" in "+p.Group)
			continue
		}
		now := time.Now().UTC()
		rec := c.encode(HostRelease{Permit: p, By: by, At: now, Reason: reason})
		logKey := fmt.Sprintf("%s%s/released/%s/%d", c.hostBase(), p.Group, host, now.UnixNano())
		if err := c.deleteHost(ctx, p, "fleet release "+host+" by "+by, clientv3.OpPut(logKey, rec)); err != nil {
			return freed, err
		}
		freed = append(freed, p)
	}
	if len(freed) == 0 {
		if len(held) == 0 {
			return nil, fmt.Errorf("host %s holds no host permit; no host does", host)
		}
		return nil, fmt.Errorf("host %s holds no host permit; held by: %s", host, strings.Join(held, ", "))
	}
	return freed, nil
}

// HostPermits reads every host permit of the fleet, oldest first.
func (c *Client) HostPermits(ctx context.Context) ([]HostPermit, error) {
	resp, err := c.cli.Get(ctx, c.hostBase(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	out := []HostPermit{}
	for _, kv := range resp.Kvs {
		if _, rest, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), c.hostBase()), "/"); strings.HasPrefix(rest, "holders/") {
			out = append(out, decodeHostPermit(kv))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Revision < out[j].Revision })
	return out, nil
}

// HostReleases reads the operators' releases logged in etcd, oldest first.
func (c *Client) HostReleases(ctx context.Context) ([]HostRelease, error) {
	resp, err := c.cli.Get(ctx, c.hostBase(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	out := []HostRelease{}
	for _, kv := range resp.Kvs {
		if _, rest, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), c.hostBase()), "/"); strings.HasPrefix(rest, "released/") {
			var r HostRelease
			if json.Unmarshal(kv.Value, &r) == nil {
				out = append(out, r)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}
