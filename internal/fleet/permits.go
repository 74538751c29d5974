// Package fleet joins the engine's rollouts and status to a fleet coordinated through
// etcd (internal/coord): Permits is the engine's agent.PermitSource, Publish keeps this
// host's status summary in etcd, and Read is `agent status --fleet`'s view. It knows the
// engine's types and coord's client; the engine knows neither etcd nor this package.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
)

// Permits is a rollout permit source over etcd. Take asks etcd at once (a disruption
// needs its yes), and only once this host's own marks are written; marks, failures and
// releases are applied in the background, retried until etcd answers (a release and a
// failure need no lease: they go as soon as etcd answers) and written again under each new
// lease or epoch and whenever the lease becomes live again (which confirms them), so that
// an observation never waits on etcd and an outage, even one that lost etcd's data, loses
// nothing.
type Permits struct {
	c   *coord.Client
	log *slog.Logger

	mu sync.Mutex
	// want is what etcd should say of each of this host's members; have is what it
	// says under lease generation gen, written since the lease became live at since.
	want, have map[string]mark
	gen        int
	since      time.Time
	// fails are stops to write; stops are the stops this host caused, lifted when
	// their member is released (and written again in a new epoch); stale are permits
	// an earlier process of this host left, deleted when their member is found healthy.
	fails map[string]mark
	stops map[string]mark
	stale map[string]string
	// ok are the members released (found healthy) since their last mark.
	ok map[string]bool
	// kept are this host's members in rollout groups (Keep; nil: not said yet).
	kept   map[string]bool
	loaded bool
	kick   chan struct{}

	cancel context.CancelFunc
	done   chan struct{}
}

type mark struct {
	group, state, action, why string
}

// NewPermits starts the background writer over c; Close stops it.
func NewPermits(c *coord.Client, log *slog.Logger) *Permits {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Permits{c: c, log: log, want: map[string]mark{}, have: map[string]mark{}, fails: map[string]mark{},
		stops: map[string]mark{}, stale: map[string]string{}, ok: map[string]bool{}, kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go p.run(ctx)
	return p
}

var _ agent.PermitSource = (*Permits)(nil)

// Take asks etcd for addr's permit (at most 10 s), once this host's other marks are
// written under the current lease: the others must count what this host has down or in
// flight before it asks for more.
func (p *Permits) Take(ctx context.Context, group, addr, action string, slots int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.awaitWritten(ctx, addr); err != nil {
		return err
	}
	_, err := p.c.Acquire(ctx, group, addr, action, slots)
	var ref *coord.Refusal
	switch {
	case err == nil:
		_, _, gen, _ := p.c.LeaseState()
		p.mu.Lock()
		defer p.mu.Unlock()
		m := mark{group: group, state: coord.Disrupting, action: action}
		p.want[addr] = m
		if gen == p.gen {
			p.have[addr] = m
		}
		delete(p.stale, addr)
		delete(p.ok, addr)
		return nil
	case errors.As(err, &ref) && ref.Stop != nil:
		return &agent.FleetRefusal{Stopped: true, Host: ref.Stop.Host, Cause: ref.Stop.Member, Reason: ref.Stop.Reason}
	case errors.As(err, &ref):
		out := &agent.FleetRefusal{}
		for _, h := range ref.Holders {
			out.Holders = append(out.Holders, h.String())
		}
		return out
	}
	return fmt.Errorf("etcd: %w", err)
}

// awaitWritten waits, within ctx, until etcd has this host's own marks (other than
// addr's) under the current lease: the background writer is poked, not bypassed.
func (p *Permits) awaitWritten(ctx context.Context, addr string) error {
	for {
		err := p.unwritten(addr)
		if err == nil || errors.Is(err, coord.ErrNoLease) {
			return err
		}
		p.poke()
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unwritten says which of this host's marks (other than addr's) etcd does not have under
// the current lease yet (nil: none).
func (p *Permits) unwritten(addr string) error {
	_, _, gen, err := p.c.LeaseState()
	if err != nil {
		return err
	}
	since := p.c.LiveSince()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.loaded {
		return errors.New("this host's permits are not read from etcd yet")
	}
	var left []string
	for a, m := range p.want {
		if a != addr && (gen != p.gen || since != p.since || p.have[a] != m) {
			left = append(left, a)
		}
	}
	for a, m := range p.fails {
		if a != addr {
			left = append(left, a+" (failed, "+m.group+")")
		}
	}
	if len(left) == 0 {
		return nil
	}
	sort.Strings(left)
	return fmt.Errorf("this host's own marks are not written to etcd yet: %s", strings.Join(left, ", "))
}

// Mark records addr as unavailable for the others: down, or still disrupted (a permit
// taken keeps its state), or failed.
func (p *Permits) Mark(group, addr, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := mark{group: group, state: coord.Down, why: why}
	if old, ok := p.want[addr]; ok && old.state == coord.Disrupting {
		m.state, m.action = coord.Disrupting, old.action
	}
	delete(p.ok, addr)
	if len(why) > 8 && why[:8] == "failed: " {
		m.state = coord.Failed
	}
	if p.want[addr] != m {
		p.want[addr] = m
		p.poke()
	}
}

// Fail stops the group fleet-wide.
func (p *Permits) Fail(group, addr, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fails[addr] = mark{group: group, why: reason}
	delete(p.ok, addr)
	p.poke()
}

// Release drops addr's permit or mark, and a stop it caused.
func (p *Permits) Release(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, wanted := p.want[addr]
	_, had := p.have[addr]
	_, stopped := p.stops[addr]
	_, stale := p.stale[addr]
	delete(p.want, addr)
	delete(p.fails, addr)
	p.ok[addr] = true
	if wanted || had || stopped || stale {
		p.poke()
	}
}

// Keep drops what etcd holds for this host's members that are in no rollout group any
// more (their block left the plan or its group): nothing would ever release them.
func (p *Permits) Keep(addrs []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.kept = map[string]bool{}
	for _, a := range addrs {
		p.kept[a] = true
	}
	p.dropUnkept()
	p.poke()
}

// dropUnkept releases every member not kept (under p.mu).
func (p *Permits) dropUnkept() {
	if p.kept == nil {
		return
	}
	for a := range p.stale {
		if !p.kept[a] {
			p.ok[a] = true
		}
	}
	for a := range p.stops {
		if !p.kept[a] {
			p.ok[a] = true
		}
	}
	for a := range p.want {
		if !p.kept[a] {
			delete(p.want, a)
			delete(p.fails, a)
			p.ok[a] = true
		}
	}
}

// Changed is closed when the lease's state or a group's permits may have changed.
func (p *Permits) Changed() <-chan struct{} { return p.c.Changed() }

// Held reports whether this host still wants permits or marks in etcd (a member down or
// in flight): then Close leaves the lease to expire rather than revoke it.
func (p *Permits) Held() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.want) > 0
}

// Close stops the writer.
func (p *Permits) Close() {
	p.cancel()
	<-p.done
}

func (p *Permits) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run writes what is wanted whenever something changes, the lease comes back, or (while
// something is not written) every half second.
func (p *Permits) run(ctx context.Context) {
	defer close(p.done)
	for {
		changed := p.c.Changed()
		pending := p.sync(ctx)
		var retry <-chan time.Time
		if pending {
			retry = time.After(500 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-changed:
		case <-retry:
		}
	}
}

// sync writes one round of differences; it reports whether some are left. Releases and
// failures go whenever etcd answers; marks need the lease, and are all written again
// under a new lease or epoch (the old keys are gone) and when the lease became live again
// (it confirms them: etcd may have returned).
func (p *Permits) sync(ctx context.Context) bool {
	_, _, gen, leaseErr := p.c.LeaseState()
	since := p.c.LiveSince()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !p.loaded {
		if err := p.load(ctx); err != nil {
			p.log.Warn("coordination: reading this host's permits", "error", err)
			return true
		}
	}
	p.mu.Lock()
	if leaseErr == nil && gen != p.gen {
		// A new lease or epoch: the old one's keys are gone, and the stops this host
		// caused may be too (an epoch): write them again.
		for a, m := range p.stops {
			if _, ok := p.fails[a]; !ok && !p.released(a) {
				p.fails[a] = m
			}
		}
		p.gen, p.have = gen, map[string]mark{}
	}
	if leaseErr == nil && since != p.since {
		// Confirm every mark; what is written and no longer wanted stays in have, to
		// be released.
		p.since = since
		for a := range p.want {
			delete(p.have, a)
		}
	}
	ops := p.diff(leaseErr == nil)
	left := leaseErr != nil && len(p.want) > 0
	p.mu.Unlock()
	for _, o := range ops {
		if !p.apply(ctx, o, gen) {
			left = true
		}
	}
	return left
}

type op struct {
	addr string
	m    mark
	kind string
}

// diff lists what etcd lacks (under p.mu); marks only with a live lease.
func (p *Permits) diff(live bool) []op {
	var ops []op
	for a, m := range p.fails {
		ops = append(ops, op{a, m, "fail"})
	}
	for a, m := range p.want {
		if live && p.have[a] != m {
			ops = append(ops, op{a, m, "hold"})
		}
	}
	for a, m := range p.have {
		if _, ok := p.want[a]; !ok {
			ops = append(ops, op{a, m, "release"})
		}
	}
	for a, g := range p.stale {
		if _, ok := p.want[a]; !ok {
			if _, ok := p.have[a]; !ok && p.released(a) {
				ops = append(ops, op{a, mark{group: g}, "release"})
			}
		}
	}
	for a, m := range p.stops {
		if _, ok := p.want[a]; !ok && p.released(a) {
			ops = append(ops, op{a, m, "unstop"})
		}
	}
	return ops
}

// apply writes one difference; it reports whether etcd took it.
func (p *Permits) apply(ctx context.Context, o op, gen int) bool {
	var err error
	switch o.kind {
	case "fail":
		err = p.c.Fail(ctx, o.m.group, o.addr, o.m.why)
	case "hold":
		err = p.c.Hold(ctx, o.m.group, o.addr, o.m.state, o.m.action, o.m.why)
	case "release":
		err = p.c.Release(ctx, o.m.group, o.addr)
	case "unstop":
		err = p.c.Unstop(ctx, o.m.group, o.addr)
	}
	if err != nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch o.kind {
	case "fail":
		if p.fails[o.addr] == o.m {
			delete(p.fails, o.addr)
		}
		p.stops[o.addr] = o.m
	case "hold":
		if p.gen == gen {
			p.have[o.addr] = o.m
		}
		delete(p.stale, o.addr)
	case "release":
		delete(p.have, o.addr)
		delete(p.stale, o.addr)
	case "unstop":
		delete(p.stops, o.addr)
	}
	return true
}

// released reports whether addr was released since this process started: only then is
// a stale permit or a stop of it dropped (under p.mu). A member never seen healthy keeps
// what an earlier process recorded.
func (p *Permits) released(addr string) bool {
	_, pending := p.fails[addr]
	return !pending && p.ok[addr]
}

// load reads what an earlier process of this host left in etcd: its permits (they count
// until this process finds their members healthy) and the stops it caused.
func (p *Permits) load(ctx context.Context) error {
	gs, err := p.c.Rollouts(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range gs {
		for _, pm := range g.Permits {
			if pm.Host == p.c.Host() {
				p.stale[pm.Member] = g.Name
			}
		}
		if g.Stop != nil && g.Stop.Host == p.c.Host() {
			p.stops[g.Stop.Member] = mark{group: g.Name, why: g.Stop.Reason}
		}
	}
	p.dropUnkept()
	p.loaded = true
	return nil
}
