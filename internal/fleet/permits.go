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
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
)

// Permits is a rollout permit source over etcd. Take asks etcd at once (a disruption
// needs its yes); marks, failures and releases are applied in the background, retried
// until etcd answers and written again under each new lease, so that an observation never
// waits on etcd and an outage loses nothing.
type Permits struct {
	c   *coord.Client
	log *slog.Logger

	mu sync.Mutex
	// want is what etcd should say of each of this host's members; have is what it
	// says under lease generation gen.
	want, have map[string]mark
	gen        int
	// fails are stops to write; stops are the stops this host caused, lifted when
	// their member is released; stale are permits an earlier process of this host
	// left, deleted when their member is found healthy.
	fails map[string]mark
	stops map[string]string
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
		stops: map[string]string{}, stale: map[string]string{}, ok: map[string]bool{}, kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go p.run(ctx)
	return p
}

var _ agent.PermitSource = (*Permits)(nil)

// Take asks etcd for addr's permit (at most 10 s).
func (p *Permits) Take(ctx context.Context, group, addr, action string, slots int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
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
	for _, set := range []map[string]string{p.stale, p.stops} {
		for a := range set {
			if !p.kept[a] {
				p.ok[a] = true
			}
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

// sync writes one round of differences; it reports whether some are left.
func (p *Permits) sync(ctx context.Context) bool {
	_, _, gen, err := p.c.LeaseState()
	if err != nil {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !p.loaded {
		if err := p.load(ctx); err != nil {
			p.log.Warn("coordination: reading this host's permits", "error", err)
			return true
		}
	}
	p.mu.Lock()
	if gen != p.gen {
		p.gen, p.have = gen, map[string]mark{} // a new lease: the old one's keys are gone
	}
	type op struct {
		addr string
		m    mark
		kind string
	}
	var ops []op
	for a, m := range p.fails {
		ops = append(ops, op{a, m, "fail"})
	}
	for a, m := range p.want {
		if p.have[a] != m {
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
	for a, g := range p.stops {
		if _, ok := p.want[a]; !ok && p.released(a) {
			ops = append(ops, op{a, mark{group: g}, "unstop"})
		}
	}
	p.mu.Unlock()
	left := false
	for _, o := range ops {
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
			left = true
			continue
		}
		p.mu.Lock()
		switch o.kind {
		case "fail":
			if p.fails[o.addr] == o.m {
				delete(p.fails, o.addr)
			}
			p.stops[o.addr] = o.m.group
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
		p.mu.Unlock()
	}
	return left
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
			p.stops[g.Stop.Member] = g.Name
		}
	}
	p.dropUnkept()
	p.loaded = true
	return nil
}
