// Package coord is the agent's etcd client: the one place that knows etcd. It keeps one
// lease per agent process, rollout permits as a semaphore of keys bound to that lease, a
// stop marker per rollout group, and each host's status entry. It knows no plan and no
// engine: callers name groups, members (a resource's address on a host) and hosts.
//
// Keys, under the fleet's prefix P:
//
//	P/rollouts/<group>/guard                  bumped by every change of the group's permits
//	P/rollouts/<group>/permits/<host>/<member> a member disrupted or down (bound to the lease)
//	P/rollouts/<group>/stopped                 a failed member stops the group (no lease)
//	P/hosts/<host>                             the host's status summary (bound to the lease)
//	P/last/<host>                              its last summary, kept after the lease lapses
//
// The semaphore is etcd's compare-and-swap recipe: count the group's permits, then create
// this member's permit in a transaction that succeeds only if the guard key has not moved
// since the count (every acquisition and every release moves it) and the group is not
// stopped. Two agents that count at once cannot both win; a permit that expires with its
// lease only lowers the count, which is safe. A permit's create revision is its fencing
// token: a release deletes the key only while it still has that revision, and a permit is
// only ever created under the holder's live lease, so an agent whose lease expired can
// neither take a permit nor release one it no longer holds.
package coord

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// Config is how to reach the fleet's etcd and what this agent is called there.
type Config struct {
	// Endpoints are the etcd members' client URLs (https://etcd1:2379, ...).
	Endpoints []string
	// CAFile verifies the members' certificates; CertFile and KeyFile are this agent's
	// client certificate (etcd's --client-cert-auth).
	CAFile, CertFile, KeyFile string
	// Prefix is the fleet's key prefix ("/agent/prod").
	Prefix string
	// Lease is the lease's time to live: a dead agent's permits and status entry
	// expire after it. Whole seconds, at least MinLease.
	Lease time.Duration
	// Host is this agent's name in the fleet (the hostname by default).
	Host string
	// Log receives the lease's losses and recoveries (nil: discarded).
	Log *slog.Logger
	// ReadOnly opens without a lease or a watch: for a view of the fleet.
	ReadOnly bool
	// LeaseFile, when set, keeps the lease's ID across restarts of the agent (in its
	// state directory): a process that starts again before the lease expired keeps it,
	// so what the dead process held (a member down mid-restart) never stops counting.
	LeaseFile string
}

// MinLease is the shortest lease: etcd refuses shorter ones (1.5 election timeouts).
const MinLease = 2 * time.Second

// DefaultLease is the lease when the plan does not say.
const DefaultLease = 15 * time.Second

// ErrNoLease is returned when this agent has no live lease (etcd unreachable longer than
// the lease, or never reached): nothing that needs a permit may start.
var ErrNoLease = errors.New("no live etcd lease")

// Client is a connection to the fleet's etcd with this agent's lease.
type Client struct {
	cfg Config
	cli *clientv3.Client
	ttl int64
	log *slog.Logger

	mu         sync.Mutex
	lease      clientv3.LeaseID
	validUntil time.Time // conservative: the renewal's send time plus the TTL
	leaseErr   error     // the last renewal's error
	generation int       // counts leases granted: a new one means the old keys are gone
	revs       map[string]int64
	changed    chan struct{}
	// announced is the lease state last logged and signalled.
	announced bool

	stop context.CancelFunc
	done chan struct{}
}

// Open connects (without waiting for etcd: an unreachable etcd is a state, not an error)
// and starts the lease's renewal loop and a watch on the rollouts. Close ends both and
// revokes the lease.
func Open(cfg Config) (*Client, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("coordination: no etcd endpoint")
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Lease < MinLease {
		return nil, fmt.Errorf("coordination: lease %s is shorter than etcd allows (%s)", cfg.Lease, MinLease)
	}
	if cfg.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("coordination: %w", err)
		}
		cfg.Host = h
	}
	if strings.Contains(cfg.Host, "/") {
		return nil, fmt.Errorf("coordination: host name %q contains a slash", cfg.Host)
	}
	cfg.Prefix = "/" + strings.Trim(cfg.Prefix, "/")
	var tlsc *tls.Config
	if cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
		info := transport.TLSInfo{CertFile: cfg.CertFile, KeyFile: cfg.KeyFile, TrustedCAFile: cfg.CAFile}
		c, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("coordination: TLS: %w (check ca_file, cert_file and key_file)", err)
		}
		tlsc = c
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            cfg.Endpoints,
		TLS:                  tlsc,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("coordination: etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{cfg: cfg, cli: cli, ttl: int64((cfg.Lease + time.Second - 1) / time.Second), log: log,
		revs: map[string]int64{}, changed: make(chan struct{}), stop: stop, done: make(chan struct{})}
	if cfg.ReadOnly {
		close(c.done)
		return c, nil
	}
	go c.run(ctx)
	return c, nil
}

// Host is this agent's name in the fleet.
func (c *Client) Host() string { return c.cfg.Host }

// Prefix is the fleet's key prefix.
func (c *Client) Prefix() string { return c.cfg.Prefix }

// TTL is the lease's time to live.
func (c *Client) TTL() time.Duration { return time.Duration(c.ttl) * time.Second }

// Close stops the renewal and the watch and revokes the lease (its permits and status
// entry go at once rather than after the TTL).
func (c *Client) Close() error {
	c.stop()
	<-c.done
	c.mu.Lock()
	id := c.lease
	c.mu.Unlock()
	if id != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if _, err := c.cli.Revoke(ctx, id); err == nil && c.cfg.LeaseFile != "" {
			_ = os.Remove(c.cfg.LeaseFile)
		}
		cancel()
	}
	return c.cli.Close()
}

// Changed is closed when the lease's state or a rollout group's keys may have changed.
func (c *Client) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *Client) signal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.changed)
	c.changed = make(chan struct{})
}

// LeaseState says whether the lease is live: its ID, until when it surely is, the
// number of leases granted so far (a new one means the old one's keys are gone), and
// why not when it is not.
func (c *Client) LeaseState() (id int64, until time.Time, generation int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lease == 0 || !time.Now().Before(c.validUntil) {
		err = ErrNoLease
		if c.leaseErr != nil {
			err = fmt.Errorf("%w: %v", ErrNoLease, c.leaseErr)
		}
		return int64(c.lease), c.validUntil, c.generation, err
	}
	return int64(c.lease), c.validUntil, c.generation, nil
}

// live returns the lease to bind keys to, refused when it may lapse within margin: a
// permit must not be taken by an agent that may already be cut off.
func (c *Client) live(margin time.Duration) (clientv3.LeaseID, error) {
	id, until, _, err := c.LeaseState()
	if err != nil {
		return 0, err
	}
	if time.Until(until) < margin {
		return 0, fmt.Errorf("%w: it was last renewed %s ago and lapses in %s", ErrNoLease,
			(c.TTL() - time.Until(until)).Round(time.Millisecond), time.Until(until).Round(time.Millisecond))
	}
	return clientv3.LeaseID(id), nil
}

// margin is how much of its TTL a lease must have left for a new permit: a third, as the
// renewal runs every third.
func (c *Client) margin() time.Duration { return c.TTL() / 3 }

// run renews the lease every third of its TTL (at once after a failure, every half
// second) and watches the rollouts until Close.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	go c.watch(ctx)
	for {
		wait := c.TTL() / 3
		if !c.renew(ctx) {
			wait = 500 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// renew grants the lease or keeps it alive; it reports whether the lease is live.
func (c *Client) renew(ctx context.Context) bool {
	c.mu.Lock()
	id := c.lease
	c.mu.Unlock()
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, c.TTL()/3)
	defer cancel()
	var ttl int64
	var err error
	if id != 0 {
		var resp *clientv3.LeaseKeepAliveResponse
		resp, err = c.cli.KeepAliveOnce(rctx, id)
		if err == nil {
			ttl = resp.TTL
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			c.log.Warn("coordination: the etcd lease expired; its permits and status entry are gone, granting a new one", "lease", fmt.Sprintf("%x", id))
			id = 0
		}
	}
	granted := false
	if id == 0 && ctx.Err() == nil && c.generation == 0 {
		if old := c.recordedLease(); old != 0 {
			if resp, kerr := c.cli.KeepAliveOnce(rctx, old); kerr == nil && resp.TTL > 0 {
				id, ttl, granted, err = old, resp.TTL, true, nil
				c.log.Info("coordination: kept the lease of this host's previous process", "lease", fmt.Sprintf("%x", old))
			}
		}
	}
	if id == 0 && ctx.Err() == nil {
		sent = time.Now()
		var resp *clientv3.LeaseGrantResponse
		resp, err = c.cli.Grant(rctx, c.ttl)
		if err == nil {
			id, ttl, granted = resp.ID, resp.TTL, true
			c.recordLease(id)
		}
	}
	c.mu.Lock()
	if granted {
		c.lease = id
		c.generation++
		c.revs = map[string]int64{}
	} else if id == 0 {
		c.lease = 0
	}
	if err == nil && ttl > 0 {
		c.validUntil, c.leaseErr = sent.Add(time.Duration(ttl)*time.Second), nil
	} else if err != nil {
		c.leaseErr = err
	}
	live := c.lease != 0 && time.Now().Before(c.validUntil)
	wasLive := c.announced
	c.announced = live
	c.mu.Unlock()
	if live != wasLive || granted {
		if live {
			c.log.Info("coordination: etcd lease live", "lease", fmt.Sprintf("%x", id), "ttl", c.TTL())
		} else if ctx.Err() == nil {
			c.log.Warn("coordination: etcd lease lapsed: no new disruption starts until it is back", "error", err)
		}
		c.signal()
	}
	return live
}

// recordedLease is the lease ID LeaseFile keeps (0: none).
func (c *Client) recordedLease() clientv3.LeaseID {
	if c.cfg.LeaseFile == "" {
		return 0
	}
	b, err := os.ReadFile(c.cfg.LeaseFile)
	if err != nil {
		return 0
	}
	id, err := strconv.ParseInt(strings.TrimSpace(string(b)), 16, 64)
	if err != nil {
		return 0
	}
	return clientv3.LeaseID(id)
}

// recordLease keeps a new lease's ID in LeaseFile (best effort: without it a restart
// only takes a new lease).
func (c *Client) recordLease(id clientv3.LeaseID) {
	if c.cfg.LeaseFile == "" {
		return
	}
	if err := atomicfile.WriteFile(c.cfg.LeaseFile, []byte(fmt.Sprintf("%x\n", int64(id))), 0o600); err != nil {
		c.log.Warn("coordination: recording the lease", "error", err)
	}
}

// watch signals Changed on every change under the rollouts, re-watching when etcd
// cancels the watch (a compaction, an outage).
func (c *Client) watch(ctx context.Context) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range c.cli.Watch(wctx, c.cfg.Prefix+"/rollouts/", clientv3.WithPrefix()) {
			if resp.Err() != nil {
				break
			}
			if len(resp.Events) > 0 {
				c.signal()
			}
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
			c.signal() // what happened meanwhile was not seen
		}
	}
}

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
// the error that kept it from asking (ErrNoLease, etcd unreachable): only a nil error
// allows the disruption.
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
		if len(holders) >= slots {
			return 0, &Refusal{Group: group, Slots: slots, Holders: holders}
		}
		val := c.encode(Permit{Group: group, Host: c.cfg.Host, Member: member, State: Disrupting, Action: action, Since: time.Now().UTC()})
		tx, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(c.guardKey(group)), "=", guardRev),
			clientv3.Compare(clientv3.ModRevision(c.stopKey(group)), "=", 0),
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
	val := c.encode(Permit{Group: group, Host: c.cfg.Host, Member: member, State: state, Action: action, Why: why, Since: time.Now().UTC()})
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

// HostEntry is a host's published status summary.
type HostEntry struct {
	Host string `json:"host"`
	// Live: its lease runs. Otherwise the entry is its last summary, from Updated.
	Live    bool            `json:"live"`
	Updated time.Time       `json:"updated"`
	Summary json.RawMessage `json:"summary"`
}

type lastEntry struct {
	Updated time.Time       `json:"updated"`
	Summary json.RawMessage `json:"summary"`
}

// Publish writes this host's status summary: under hosts/ bound to the lease (it goes
// when the host does), and under last/ without one (what the fleet view shows of a
// host whose lease lapsed, and since when).
func (c *Client) Publish(ctx context.Context, summary json.RawMessage) error {
	lease, err := c.live(0)
	if err != nil {
		return err
	}
	val := c.encode(lastEntry{Updated: time.Now().UTC(), Summary: summary})
	_, err = c.cli.Txn(ctx).Then(
		clientv3.OpPut(c.cfg.Prefix+"/hosts/"+c.cfg.Host, val, clientv3.WithLease(lease)),
		clientv3.OpPut(c.cfg.Prefix+"/last/"+c.cfg.Host, val),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}

// Hosts reads every host that ever published, by name; a host whose lease lapsed is not
// Live, with its last summary.
func (c *Client) Hosts(ctx context.Context) ([]HostEntry, error) {
	out := map[string]*HostEntry{}
	for _, part := range []string{"/last/", "/hosts/"} {
		base := c.cfg.Prefix + part
		resp, err := c.cli.Get(ctx, base, clientv3.WithPrefix())
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		for _, kv := range resp.Kvs {
			var e lastEntry
			if json.Unmarshal(kv.Value, &e) != nil {
				continue
			}
			h := strings.TrimPrefix(string(kv.Key), base)
			out[h] = &HostEntry{Host: h, Live: part == "/hosts/", Updated: e.Updated, Summary: e.Summary}
		}
	}
	var list []HostEntry
	for _, e := range out {
		list = append(list, *e)
	}
	sort.Slice(list, func(i, j int) bool { return list[i].Host < list[j].Host })
	return list, nil
}

// Abandon stops the renewal and closes the connection without revoking the lease: the
// permits of members still down keep counting until the lease expires, as if the agent
// had died.
func (c *Client) Abandon() {
	c.stop()
	<-c.done
	_ = c.cli.Close()
}
