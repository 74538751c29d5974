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
