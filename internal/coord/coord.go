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
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	generation int       // counts leases granted and epochs: a new one means the old keys are gone
	revs       map[string]int64
	changed    chan struct{}
	// announced is the lease state last logged and signalled; liveSince is when it last
	// became live (published as the host entry's Connected).
	announced bool
	liveSince time.Time
	// The epoch (session.go): etcd's cluster ID and the highest revision renew saw, the
	// last renewal's send time, and whether this process published its entry.
	clusterID uint64
	maxRev    int64
	renewedAt time.Time
	published bool
	// kick renews at once (the connection came back); rewatch restarts the watch (etcd
	// lost its state: the watch's next revision may never come).
	kick, rewatch chan struct{}

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
	cli, err := clientv3.New(dialConfig(cfg.Endpoints, tlsc, cfg.Lease))
	if err != nil {
		return nil, fmt.Errorf("coordination: etcd %s: %w", strings.Join(cfg.Endpoints, ","), err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{cfg: cfg, cli: cli, ttl: int64((cfg.Lease + time.Second - 1) / time.Second), log: log,
		revs: map[string]int64{}, changed: make(chan struct{}), stop: stop, done: make(chan struct{}),
		kick: make(chan struct{}, 1), rewatch: make(chan struct{}, 1)}
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

// HostEntry is a host's published status summary.
type HostEntry struct {
	Host string `json:"host"`
	// Live: its lease runs. Otherwise the entry is its last summary, from Updated.
	Live    bool      `json:"live"`
	Updated time.Time `json:"updated"`
	// Connected is when its lease last became live (zero: not said).
	Connected time.Time       `json:"connected"`
	Summary   json.RawMessage `json:"summary"`
}

type lastEntry struct {
	Updated   time.Time       `json:"updated"`
	Connected time.Time       `json:"connected,omitzero"`
	Summary   json.RawMessage `json:"summary"`
}

// Publish writes this host's status summary: under hosts/ bound to the lease (it goes
// when the host does), and under last/ without one (what the fleet view shows of a
// host whose lease lapsed, and since when).
func (c *Client) Publish(ctx context.Context, summary json.RawMessage) error {
	lease, err := c.live(0)
	if err != nil {
		return err
	}
	val := c.encode(lastEntry{Updated: time.Now().UTC(), Connected: c.LiveSince().UTC(), Summary: summary})
	_, err = c.cli.Txn(ctx).Then(
		clientv3.OpPut(c.cfg.Prefix+"/hosts/"+c.cfg.Host, val, clientv3.WithLease(lease)),
		clientv3.OpPut(c.cfg.Prefix+"/last/"+c.cfg.Host, val),
	).Commit()
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	c.mu.Lock()
	c.published = true // its last/ entry gone is a sign that etcd lost its state
	c.mu.Unlock()
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
			out[h] = &HostEntry{Host: h, Live: part == "/hosts/", Updated: e.Updated, Connected: e.Connected, Summary: e.Summary}
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
