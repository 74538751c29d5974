package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/view"
)

// Summary is what a host publishes under <prefix>/hosts/<hostname>: enough for a fleet
// view without asking the host.
type Summary struct {
	Host    string `json:"host"`
	Version string `json:"version"`
	// Healthy: every resource is.
	Healthy   bool              `json:"healthy"`
	Resources []ResourceSummary `json:"resources"`
	// Rollouts are the members this host disrupted and has not verified yet.
	Rollouts []InFlight `json:"rollouts"`
}

// ResourceSummary is one resource's health.
type ResourceSummary struct {
	Address string `json:"address"`
	Healthy bool   `json:"healthy"`
	Summary string `json:"summary"`
	Error   string `json:"error"`
}

// InFlight is a member disrupted and not verified yet.
type InFlight struct {
	Group  string    `json:"group"`
	Member string    `json:"member"`
	Action string    `json:"action"`
	Since  time.Time `json:"since"`
	Failed string    `json:"failed"`
}

// SummaryOf summarises a status report and the members in flight. red redacts what a
// status may quote (errors can carry a plan's secret).
func SummaryOf(host, version string, rep *agent.Report, inFlight map[string]agent.InFlightMember, red *view.Redactor) Summary {
	s := Summary{Host: host, Version: version, Healthy: true, Resources: []ResourceSummary{}, Rollouts: []InFlight{}}
	if rep != nil {
		for _, st := range rep.Steps {
			r := ResourceSummary{Address: st.Addr}
			if st.Status != nil {
				r.Healthy, r.Summary = st.Status.Healthy, red.String(st.Status.Summary)
			}
			if st.Err != nil {
				r.Healthy, r.Error = false, red.String(st.Err.Error())
			}
			s.Healthy = s.Healthy && r.Healthy
			s.Resources = append(s.Resources, r)
		}
	}
	for a, m := range inFlight {
		s.Rollouts = append(s.Rollouts, InFlight{Group: m.Group, Member: a, Action: m.Action, Since: m.Since, Failed: red.String(m.Failed)})
	}
	sort.Slice(s.Rollouts, func(i, j int) bool { return s.Rollouts[i].Member < s.Rollouts[j].Member })
	return s
}

// Publish writes the summary whenever it changes (looked at four times a second) and at
// least every third of the lease, until ctx ends: the host's entry lives with its lease,
// and its last copy says when it was last heard from.
func Publish(ctx context.Context, c *coord.Client, log *slog.Logger, summary func() Summary) {
	var last []byte
	var lastAt, failingSince time.Time
	warned := false
	for {
		b, err := json.Marshal(summary())
		if err == nil && (!bytes.Equal(b, last) || time.Since(lastAt) >= c.TTL()/3) {
			pctx, cancel := context.WithTimeout(ctx, c.TTL()/2)
			err = c.Publish(pctx, b)
			cancel()
			if err == nil {
				last, lastAt = b, time.Now()
			}
		}
		switch {
		case err == nil:
			failingSince, warned = time.Time{}, false
		case failingSince.IsZero():
			failingSince = time.Now()
		case !warned && time.Since(failingSince) > c.TTL() && ctx.Err() == nil && log != nil:
			// The lease lapsing is logged already; this says the entry is stale.
			log.Warn("coordination: this host's status is not published", "error", err, "since", failingSince)
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Status is the fleet as etcd has it: `agent status --fleet`.
type Status struct {
	Prefix   string        `json:"prefix"`
	Hosts    []HostStatus  `json:"hosts"`
	Rollouts []coord.Group `json:"rollouts"`
	// HostPermits are the hosts under disruption (a driver upgrade, a reboot, a drain),
	// oldest first: each holds its host group's permit until it is verified again.
	HostPermits []coord.HostPermit `json:"host_permits"`
	// Epoch is the fence of a new epoch (etcd lost its state): no new permit until it
	// expires. Nil when none.
	Epoch *coord.Epoch `json:"epoch,omitempty"`
}

// HostStatus is one host: its last summary, and whether its lease still runs.
type HostStatus struct {
	Host      string `json:"host"`
	Reachable bool   `json:"reachable"`
	// Updated is when it last published; for an unreachable host, since when it has
	// not been heard from; with From, when its /status was asked.
	Updated time.Time `json:"updated"`
	Summary *Summary  `json:"summary"`
	// From says where the summary was read when etcd could not be (`--hosts`): the
	// agent's own /status at an address; "" for etcd. Error is why it could not be.
	From  string `json:"from,omitempty"`
	Error string `json:"error,omitempty"`
}

// Read reads the fleet's hosts and rollouts.
func Read(ctx context.Context, c *coord.Client) (*Status, error) {
	hosts, err := c.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	groups, err := c.Rollouts(ctx)
	if err != nil {
		return nil, err
	}
	epoch, err := c.Fence(ctx)
	if err != nil {
		return nil, err
	}
	held, err := c.HostPermits(ctx)
	if err != nil {
		return nil, err
	}
	st := &Status{Prefix: c.Prefix(), Hosts: []HostStatus{}, Rollouts: groups, HostPermits: held, Epoch: epoch}
	if st.Rollouts == nil {
		st.Rollouts = []coord.Group{}
	}
	markUnconfirmed(hosts, st.Rollouts)
	for _, h := range hosts {
		hs := HostStatus{Host: h.Host, Reachable: h.Live, Updated: h.Updated}
		var s Summary
		if json.Unmarshal(h.Summary, &s) == nil {
			hs.Summary = &s
		}
		st.Hosts = append(st.Hosts, hs)
	}
	return st, nil
}

// markUnconfirmed flags the permits whose host's lease became live again (etcd returned,
// or the host was cut off) after the host last wrote them: until it writes them again
// (at once, if they still hold) they may be stale (a member converged meanwhile whose
// release has not reached etcd yet).
func markUnconfirmed(hosts []coord.HostEntry, groups []coord.Group) {
	connected := map[string]time.Time{}
	for _, h := range hosts {
		if h.Live && !h.Connected.IsZero() {
			connected[h.Host] = h.Connected
		}
	}
	for gi := range groups {
		for pi := range groups[gi].Permits {
			pm := &groups[gi].Permits[pi]
			if at, ok := connected[pm.Host]; ok && pm.Confirmed.Before(at) {
				pm.Unconfirmed = true
			}
		}
	}
}

// FromAgents reads each agent's own /status at addrs (their metrics_listen addresses, at
// most 5 s): `agent status --fleet --hosts` when etcd cannot be read. A host is named by
// its address; an agent that does not answer has Error.
func FromAgents(ctx context.Context, addrs []string, red *view.Redactor) []HostStatus {
	out := make([]HostStatus, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = fromAgent(ctx, a, red)
		}()
	}
	wg.Wait()
	return out
}

func fromAgent(ctx context.Context, addr string, red *view.Redactor) HostStatus {
	hs := HostStatus{Host: addr, From: "agent run's /status at " + addr, Updated: time.Now().UTC()}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	url := addr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimSuffix(url, "/")+"/status", nil)
	if err != nil {
		hs.Error = err.Error()
		return hs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		hs.Error = fmt.Sprintf("%v (is agent run up there, with metrics_listen on this address?)", err)
		return hs
	}
	defer resp.Body.Close()
	var doc view.JSONOutput
	if resp.StatusCode != http.StatusOK {
		hs.Error = fmt.Sprintf("%s answered %s", addr, resp.Status)
		return hs
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		hs.Error = fmt.Sprintf("%s: its /status is not a status document: %v", addr, err)
		return hs
	}
	s := Summary{Host: addr, Healthy: doc.OK, Resources: []ResourceSummary{}, Rollouts: []InFlight{}}
	for _, r := range doc.Resources {
		rs := ResourceSummary{Address: r.Address, Error: red.String(r.Error)}
		if r.Status != nil {
			rs.Healthy, rs.Summary = r.Status.Healthy && r.Error == "", red.String(r.Status.Summary)
		}
		s.Healthy = s.Healthy && rs.Healthy
		s.Resources = append(s.Resources, rs)
	}
	hs.Summary = &s
	return hs
}

// Document is `agent status --fleet --json`: a status document (format_version 3) whose
// resources are per host, under fleet; an error document has no fleet.
type Document struct {
	*view.JSONOutput
	Fleet *Status `json:"fleet,omitempty"`
}

// NewDocument is the fleet's status document.
func NewDocument(st *Status) *Document {
	if st.HostPermits == nil {
		st.HostPermits = []coord.HostPermit{}
	}
	doc := &Document{JSONOutput: view.NewJSONOutput("status"), Fleet: st}
	doc.OK = true
	return doc
}

// Degraded reports whether a host is unreachable, unhealthy or under disruption, or a
// rollout stopped.
func (s *Status) Degraded() bool {
	if len(s.HostPermits) > 0 {
		return true
	}
	for _, h := range s.Hosts {
		if !h.Reachable || h.Summary == nil || !h.Summary.Healthy {
			return true
		}
	}
	for _, g := range s.Rollouts {
		if g.Stop != nil {
			return true
		}
	}
	return false
}
