package coord

// The session: the connection's settings, the lease's renewal, the watch, and the epoch.
//
// The connection. gRPC's default reconnect backoff grows to 120 s: an etcd back after a
// 30 s outage was reached 7 to 17 s late, after it had expired the leases. Here the
// backoff starts at 100 ms and is capped at ReconnectMax (1 s), a connection attempt
// gives up after ConnectTimeout, keep-alive pings on an idle-looking connection notice a
// dead one, and the renewal runs at once when the connection is ready again: an agent
// renews its lease within about a second of etcd answering, well inside the lease that
// etcd restores (in full) when it starts again with its data.
//
// The epoch. etcd may come back without its data (a member on a tmpfs, a member
// replaced, a restore from an older snapshot): every lease, permit, mark and host entry
// is gone, and an agent that asked for a permit first would count nothing of what the
// others have down. renew notices (the lease gone before its TTL, or this host's
// last/ entry gone, a revision lower than one seen, a new cluster ID) and, before it
// takes its new lease, writes the fence, P/rollouts/epoch, bound to a lease of its own
// with the fleet's TTL: while it exists Acquire refuses every new permit, so every host
// known before has a full lease to write its marks again (each one that comes back
// writes the fence again, extending it). Marks (Hold) are never fenced.

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// The connection's settings (docs/fleet.md, "What happens when something fails").
const (
	// ReconnectMax caps the backoff between two connection attempts.
	ReconnectMax = time.Second
	// ConnectTimeout is how long one connection attempt may take.
	ConnectTimeout = 2 * time.Second
	// KeepAliveTime is how long a connection may be quiet before the client pings it
	// (gRPC's shortest), and KeepAliveTimeout how long the ping's answer may take: a
	// connection that stopped carrying bytes is closed after at most 12 s and dialled
	// again. A lease shorter than that is kept by the renewal's own deadline (a third of
	// the TTL) and lapses while the connection is dead, as it must.
	KeepAliveTime    = 10 * time.Second
	KeepAliveTimeout = 2 * time.Second
)

// dialConfig is the client's configuration: no blocking dial, the reconnect settings.
func dialConfig(endpoints []string, tlsc *tls.Config, lease time.Duration) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		TLS:                  tlsc,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    KeepAliveTime,
		DialKeepAliveTimeout: KeepAliveTimeout,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: ReconnectMax},
			MinConnectTimeout: min(ConnectTimeout, lease/2),
		})},
	}
}

// LeaseState says whether the lease is live: its ID, until when it surely is, the
// number of leases granted and epochs seen so far (a new one means the keys this client
// wrote are gone), and why not when it is not.
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

// LiveSince is when the lease last became live (zero: never): what this client wrote
// before then may not have been confirmed since.
func (c *Client) LiveSince() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.liveSince
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

// run renews the lease every third of its TTL (after a failure every half second, and at
// once when the connection is ready again) and watches the rollouts until Close.
func (c *Client) run(ctx context.Context) {
	defer close(c.done)
	c.loadRecord()
	go c.watch(ctx)
	go c.wakeOnReady(ctx)
	for {
		wait := c.TTL() / 3
		if !c.renew(ctx) {
			wait = 500 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			c.mu.Lock()
			id := c.lease
			c.mu.Unlock()
			if id != 0 {
				c.recordLease(id) // the revision seen last, for the next process's epoch check
			}
			return
		case <-time.After(wait):
		case <-c.kick:
		}
	}
}

// wakeOnReady kicks the renewal whenever the connection becomes ready.
func (c *Client) wakeOnReady(ctx context.Context) {
	conn := c.cli.ActiveConnection()
	for {
		s := conn.GetState()
		if !conn.WaitForStateChange(ctx, s) {
			return
		}
		if conn.GetState() == connectivity.Ready {
			select {
			case c.kick <- struct{}{}:
			default:
			}
		}
	}
}

// renewal is one round of renew: the lease kept or granted, and what etcd said.
type renewal struct {
	id  clientv3.LeaseID
	ttl int64
	// sent is when the request that set ttl was sent (the lease surely lives TTL from it).
	sent time.Time
	// fresh: a lease new to this process (granted, or its previous process's kept).
	fresh bool
	// lost says why etcd lost its state ("": it did not).
	lost string
	err  error
}

// renew grants the lease or keeps it alive; it reports whether the lease is live.
func (c *Client) renew(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, c.TTL()/3)
	defer cancel()
	r := c.keepOrGrant(rctx)
	c.mu.Lock()
	if r.id != c.lease && r.err == nil {
		c.lease = r.id
	}
	if r.fresh || r.lost != "" {
		c.generation++
		c.revs = map[string]int64{}
	}
	if r.lost != "" {
		c.published = false // its last/ entry is gone until it publishes again
	}
	if r.err == nil && r.ttl > 0 {
		c.validUntil, c.leaseErr, c.renewedAt = r.sent.Add(time.Duration(r.ttl)*time.Second), nil, r.sent
	} else if r.err != nil {
		c.leaseErr = r.err
	}
	live := c.lease != 0 && time.Now().Before(c.validUntil)
	wasLive := c.announced
	c.announced = live
	if live && (!wasLive || r.fresh || r.lost != "") {
		c.liveSince = time.Now()
	}
	id := c.lease
	c.mu.Unlock()
	if r.lost != "" {
		select {
		case c.rewatch <- struct{}{}:
		default:
		}
	}
	if live != wasLive || r.fresh || r.lost != "" {
		if live {
			c.log.Info("coordination: etcd lease live", "lease", fmt.Sprintf("%x", id), "ttl", c.TTL())
		} else if ctx.Err() == nil {
			c.log.Warn("coordination: etcd lease lapsed: no new disruption starts until it is back", "error", r.err)
		}
		c.signal()
	}
	return live
}

// keepOrGrant keeps the lease alive (at the first round, the previous process's one from
// LeaseFile), or grants a new one when it is gone, fencing the fleet first when etcd lost
// its state.
func (c *Client) keepOrGrant(ctx context.Context) renewal {
	c.mu.Lock()
	id, gen, seen, renewed := c.lease, c.generation, c.maxRev, c.renewedAt
	c.mu.Unlock()
	if id == 0 && gen == 0 {
		id = c.recordedLease()
	}
	r := renewal{id: id, sent: time.Now()}
	if id != 0 {
		resp, err := c.cli.KeepAliveOnce(ctx, id)
		switch {
		case err == nil && resp.TTL > 0:
			// Kept; a revision lower than one seen still says etcd lost writes (a
			// restore from an older snapshot that had this lease).
			r.ttl, r.fresh = resp.TTL, gen == 0
			h := resp.ResponseHeader
			if why := c.lostBy(h, seen); why != "" {
				// The member that answered may lag behind one that answered before: a
				// linearizable read says whether etcd's revision really went back.
				why, h, r.err = c.confirmLost(ctx, seen)
				if r.err != nil {
					return r
				}
				if why != "" {
					if r.err = c.fence(ctx, why); r.err != nil {
						return r
					}
					r.lost = why
				}
			}
			c.adopt(h, r.lost != "")
			if r.fresh {
				c.log.Info("coordination: kept the lease of this host's previous process", "lease", fmt.Sprintf("%x", id))
			}
			return r
		case err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound):
			r.err = err
			return r
		}
		// Gone: expired while this agent was cut off (or down), or etcd lost it.
		why, h, err := c.leaseGone(ctx, renewed, seen)
		if err != nil {
			r.err = err
			return r
		}
		if gen > 0 || why != "" {
			c.log.Warn("coordination: the etcd lease expired; its permits and status entry are gone, granting a new one", "lease", fmt.Sprintf("%x", id))
		}
		if why != "" {
			if r.err = c.fence(ctx, why); r.err != nil {
				return r
			}
			r.lost = why
			c.adopt(h, true)
		}
	}
	r.sent = time.Now()
	resp, err := c.cli.Grant(ctx, c.ttl)
	if err != nil {
		r.id, r.err = 0, err
		return r
	}
	c.adopt(resp.ResponseHeader, false)
	r.id, r.ttl, r.fresh = resp.ID, resp.TTL, true
	c.recordLease(resp.ID)
	return r
}

// lostBy says why etcd lost its state if a response to a request sent when seen was the
// highest revision seen shows it ("": it did not): a new cluster ID, a lower revision.
func (c *Client) lostBy(h *etcdserverpb.ResponseHeader, seen int64) string {
	if h == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.clusterID != 0 && h.ClusterId != 0 && h.ClusterId != c.clusterID:
		return fmt.Sprintf("etcd's cluster ID changed from %x to %x", c.clusterID, h.ClusterId)
	case seen > 0 && h.Revision < seen:
		return fmt.Sprintf("etcd's revision went back from %d to %d", seen, h.Revision)
	}
	return ""
}

// confirmLost reads this host's last/ entry (a linearizable read: its revision is at
// least any revision etcd had committed before) and says whether it shows that etcd lost
// its state; h is its header.
func (c *Client) confirmLost(ctx context.Context, seen int64) (string, *etcdserverpb.ResponseHeader, error) {
	resp, err := c.cli.Get(ctx, c.cfg.Prefix+"/last/"+c.cfg.Host)
	if err != nil {
		return "", nil, err
	}
	return c.lostBy(resp.Header, seen), resp.Header, nil
}

// adopt notes etcd's cluster ID and revision from a response; reset takes them as they
// are (a new epoch), else the revision only grows.
func (c *Client) adopt(h *etcdserverpb.ResponseHeader, reset bool) {
	if h == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.ClusterId != 0 {
		c.clusterID = h.ClusterId
	}
	if reset || h.Revision > c.maxRev {
		c.maxRev = h.Revision
	}
}

// leaseGone says whether a lease etcd no longer has was lost with etcd's state ("": it
// may have expired), from the cluster ID, the revision, this host's last/ entry (kept
// without a lease) and how long ago the lease was last renewed; h is the header to adopt.
func (c *Client) leaseGone(ctx context.Context, renewed time.Time, seen int64) (string, *etcdserverpb.ResponseHeader, error) {
	resp, err := c.cli.Get(ctx, c.cfg.Prefix+"/last/"+c.cfg.Host)
	if err != nil {
		return "", nil, err
	}
	if why := c.lostBy(resp.Header, seen); why != "" {
		return why, resp.Header, nil
	}
	c.adopt(resp.Header, false)
	c.mu.Lock()
	published := c.published
	c.mu.Unlock()
	if published && len(resp.Kvs) == 0 {
		return "this host's entry " + c.cfg.Prefix + "/last/" + c.cfg.Host + " is gone", resp.Header, nil
	}
	if since := time.Since(renewed); !renewed.IsZero() && since < c.TTL() {
		return fmt.Sprintf("the lease is gone %s after its last renewal, before its TTL (%s)", since.Round(time.Millisecond), c.TTL()), resp.Header, nil
	}
	return "", resp.Header, nil
}

// Epoch is the fence a host writes when it finds that etcd lost its state: no new permit
// anywhere until it expires (one lease after the last host that came back wrote it).
type Epoch struct {
	Host   string    `json:"host"`
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	// Until is when it expires at the latest (the writer's clock).
	Until time.Time `json:"until"`
}

func (e *Epoch) Error() string {
	return fmt.Sprintf("etcd lost its state (%s; seen by %s at %s): no new permit until %s, while every host writes what it has down or in flight again",
		e.Reason, e.Host, e.Since.Format("15:04:05.000"), e.Until.Format("15:04:05"))
}

func (c *Client) fenceKey() string { return c.cfg.Prefix + "/rollouts/epoch" }

// fence writes the epoch's fence under a lease of its own with the fleet's TTL.
func (c *Client) fence(ctx context.Context, why string) error {
	g, err := c.cli.Grant(ctx, c.ttl)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	e := Epoch{Host: c.cfg.Host, Reason: why, Since: now, Until: now.Add(time.Duration(g.TTL) * time.Second)}
	if _, err := c.cli.Put(ctx, c.fenceKey(), c.encode(e), clientv3.WithLease(g.ID)); err != nil {
		return err
	}
	c.log.Warn("coordination: etcd lost its state: a new epoch; no host takes a new permit for one lease while every host writes its marks again",
		"reason", why, "until", e.Until)
	return nil
}

// Fence reads the epoch's fence (nil: none).
func (c *Client) Fence(ctx context.Context) (*Epoch, error) {
	resp, err := c.cli.Get(ctx, c.fenceKey())
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	e := &Epoch{Reason: "unreadable fence " + c.fenceKey()}
	_ = json.Unmarshal(resp.Kvs[0].Value, e)
	return e, nil
}

// The lease file: "<lease> <cluster ID> <revision>" in hex, hex and decimal.

// recordedLease is the lease ID LeaseFile keeps (0: none).
func (c *Client) recordedLease() clientv3.LeaseID {
	f := c.readRecord()
	if len(f) == 0 {
		return 0
	}
	id, err := strconv.ParseInt(f[0], 16, 64)
	if err != nil {
		return 0
	}
	return clientv3.LeaseID(id)
}

func (c *Client) readRecord() []string {
	if c.cfg.LeaseFile == "" {
		return nil
	}
	b, err := os.ReadFile(c.cfg.LeaseFile)
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// loadRecord takes the cluster ID and revision the previous process saw last: an etcd
// that lost its state meanwhile is a new epoch for this one too.
func (c *Client) loadRecord() {
	f := c.readRecord()
	if len(f) < 3 {
		return
	}
	id, err1 := strconv.ParseUint(f[1], 16, 64)
	rev, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	c.mu.Lock()
	c.clusterID, c.maxRev = id, rev
	c.mu.Unlock()
}

// recordLease keeps a lease's ID, with the cluster ID and revision seen, in LeaseFile
// (best effort: without it a restart only takes a new lease).
func (c *Client) recordLease(id clientv3.LeaseID) {
	if c.cfg.LeaseFile == "" {
		return
	}
	c.mu.Lock()
	line := fmt.Sprintf("%x %x %d\n", int64(id), c.clusterID, c.maxRev)
	c.mu.Unlock()
	if err := atomicfile.WriteFile(c.cfg.LeaseFile, []byte(line), 0o600); err != nil {
		c.log.Warn("coordination: recording the lease", "error", err)
	}
}

// watch signals Changed on every change under the rollouts, re-watching when etcd
// cancels the watch (a compaction, an outage) or lost its state.
func (c *Client) watch(ctx context.Context) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := c.cli.Watch(wctx, c.cfg.Prefix+"/rollouts/", clientv3.WithPrefix())
	read:
		for {
			select {
			case resp, ok := <-wch:
				if !ok || resp.Err() != nil {
					break read
				}
				if len(resp.Events) > 0 {
					c.signal()
				}
			case <-c.rewatch:
				break read
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
