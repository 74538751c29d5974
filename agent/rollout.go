package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/internal/dag"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// Rolling changes. A resource with a rollout block belongs to a group; a disruption of a
// member (a restart, replace or delete: Action.Destructive) starts only while fewer than
// the group's max_unavailable members are unavailable, and the member counts as
// unavailable from then until a fresh Check verifies it converged. A member observed
// down (missing, gone, unhealthy, wedged, or that cannot be observed) counts as unavailable too,
// as Kubernetes counts a pod that is not ready; its repair is never held back, since it
// disrupts nothing that serves. The first failure of a member stops the group's rollout
// until that member is repaired.
//
// The members in flight are recorded in <state-dir>/rollouts.json before each one is
// disrupted, so after a SIGKILL the next apply (or `agent run`) counts them as
// unavailable, completes them first, and never exceeds the limit. The engine knows no
// kind: "down" is read from a Check's reasons (Diff.Unavailable).

// Rollouts holds the rollout permits of one state directory: what each group member was
// last observed as and which members are in flight. Every engine of a process over that
// directory must share one (Options.Rollouts), so that the reconcile loop's engines, one
// per plan reload, count the same disruptions.
type Rollouts struct {
	store *state.Store

	mu       sync.Mutex
	loaded   bool
	inFlight map[string]state.RolloutMember
	// seen is what each member was last observed as: "" available, else why it is not.
	// A member absent from it has not been observed by this process.
	seen map[string]string
	// wants are the members last observed healthy with a disruption to carry out.
	wants map[string]bool
	// changed is closed (and replaced) whenever a count may have changed.
	changed chan struct{}

	// fleet counts the members on other hosts (nil: none; rollout_fleet.go), told
	// about members by their group's name.
	fleet     PermitSource
	groupName map[string]string
	// admitMu keeps admits in order while one asks the fleet without r.mu.
	admitMu sync.Mutex
}

// NewRollouts returns the rollout permits of the state directory of store.
func NewRollouts(store *state.Store) *Rollouts {
	return &Rollouts{store: store, seen: map[string]string{}, wants: map[string]bool{}, changed: make(chan struct{})}
}

// load reads the members in flight once (under r.mu).
func (r *Rollouts) load() error {
	if r.loaded {
		return nil
	}
	m, err := r.store.LoadRollouts()
	if err != nil {
		return err
	}
	r.inFlight, r.loaded = m, true
	return nil
}

// save writes the members in flight (under r.mu).
func (r *Rollouts) save() error {
	if err := r.store.SaveRollouts(r.inFlight); err != nil {
		return fmt.Errorf("record the rollout's progress: %w", err)
	}
	return nil
}

// notify wakes everything waiting for a count to change (under r.mu).
func (r *Rollouts) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// poke wakes the waiters: something they depend on (a step of the apply) ended.
func (r *Rollouts) poke() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notify()
}

// Unavailable reports whether the resource the diff describes is down: not on the host,
// gone, unhealthy past its grace, proven wedged (it runs, and serves nothing), or on a GPU
// whose fault asks for the application to be restarted (its work on that GPU is lost). Such a
// member of a rollout group counts as unavailable, and acting on it is a repair, never
// held back: not by another member's disruption in flight, nor by the fleet's permits.
func (d *Diff) Unavailable() (why string, down bool) {
	for _, c := range d.Changes {
		switch c.Why() {
		case ReasonMissing, ReasonGone, ReasonUnhealthy, ReasonWedged, ReasonGPUFault:
			return c.Why().Describe(), true
		}
	}
	if d.Action == Create {
		return ReasonMissing.Describe(), true
	}
	return "", false
}

// observed records what a member was just observed as. A member in flight that a Check
// now finds converged has been verified: its permit is returned. (Only apply and the
// loop record observations; plan changes nothing.)
func (r *Rollouts) observed(addr string, d *Diff, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	was, had := r.seen[addr]
	wanted := r.wants[addr]
	r.seen[addr], r.wants[addr] = "", false
	if err != nil {
		r.seen[addr] = "could not be observed: " + err.Error()
	} else if why, down := d.Unavailable(); down {
		r.seen[addr] = why
	} else {
		r.wants[addr] = d.Action.Destructive()
	}
	changed := !had || was != r.seen[addr] || wanted != r.wants[addr]
	if err == nil && d.Action == NoOp && r.load() == nil {
		if _, ok := r.inFlight[addr]; ok {
			delete(r.inFlight, addr)
			// A failed save leaves it listed in the file: the next run counts it once
			// more until it observes it converged, which is safe.
			_ = r.save()
			changed = true
		}
	}
	// The fleet is told every time (it writes only what changed): what it dropped or
	// could not write is told again at the next observation.
	r.tellFleet(addr)
	if changed {
		r.notify()
	}
}

// blocker is a member that holds a group at its limit; remote ones are on other hosts
// (addr then describes it whole).
type blocker struct {
	addr, why string
	remote    bool
}

// admit takes a permit for addr to carry out act, or says why it may not now. A member
// already in flight (resumed after a SIGKILL, retried after a failure) holds its permit;
// a down member is repaired at once; a healthy member is disrupted only while fewer than
// MaxUnavailable others are unavailable and no member's failure stopped the rollout.
// The permit is recorded before admit returns. fresh says a permit was newly taken (the
// caller gives it back with release if it then does not act). changed is closed when the
// verdict may have changed.
//
// pending, when not nil (an apply), says whether a member may still act in this apply:
// healthy members are then disrupted in the order the plan declares them, so an operator
// knows which goes first (a canary declared first). The loop has no such order.
func (r *Rollouts) admit(ctx context.Context, g *plans.RolloutGroup, addr string, act Action, pending func(string) bool) (fresh bool, refusal *RolloutError, changed <-chan struct{}, err error) {
	r.admitMu.Lock()
	defer r.admitMu.Unlock()
	changed = r.Changed()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.load(); err != nil {
		return false, nil, changed, err
	}
	if m, ok := r.inFlight[addr]; ok {
		// Its failure, if it had one, stands until it is verified: a retry in progress
		// still stops the rest of the group.
		m.Action = string(act)
		r.inFlight[addr] = m
		if err := r.save(); err != nil {
			return false, nil, changed, err
		}
		r.tellFleet(addr)
		r.notify()
		return false, nil, changed, nil
	}
	if why := r.seen[addr]; why == "" {
		var blockers, ahead []blocker
		first := true // addr comes before o in the plan
		for _, o := range g.Members {
			if o == addr {
				first = false
				continue
			}
			if _, busy := r.inFlight[o]; !busy && first && pending != nil && r.wants[o] && pending(o) {
				ahead = append(ahead, blocker{addr: o, why: "declared first, goes first"})
			}
			if m, ok := r.inFlight[o]; ok {
				if m.Failed != "" {
					return false, &RolloutError{Group: g.Name, Max: g.MaxUnavailable, Stopped: true, Cause: o, Member: m.Member, Reason: m.Failed}, changed, nil
				}
				blockers = append(blockers, blocker{addr: o, why: m.Action + " not verified yet"})
				continue
			}
			why, ok := r.seen[o]
			if !ok {
				why = "not observed yet"
			}
			if why != "" {
				blockers = append(blockers, blocker{addr: o, why: why})
			}
		}
		if len(blockers) >= g.MaxUnavailable || len(ahead) > 0 {
			return false, &RolloutError{Group: g.Name, Max: g.MaxUnavailable, blockers: append(blockers, ahead...)}, changed, nil
		}
		if r.fleet != nil {
			if refusal := r.takeFleet(ctx, g.Name, g.MaxUnavailable, addr, act, g.MaxUnavailable-len(blockers), blockers); refusal != nil {
				return false, refusal, changed, nil
			}
		}
	}
	r.inFlight[addr] = state.RolloutMember{Group: g.Name, Action: string(act), Since: time.Now().UTC()}
	if err := r.save(); err != nil {
		delete(r.inFlight, addr)
		r.tellFleet(addr)
		return false, nil, changed, err
	}
	r.tellFleet(addr)
	r.notify()
	return true, nil, changed, nil
}

// release gives back a permit admit just took, for a member that did not act after all.
func (r *Rollouts) release(addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.inFlight[addr]; !ok {
		return
	}
	delete(r.inFlight, addr)
	_ = r.save() // left in the file, it is counted once more next run until observed converged
	r.tellFleet(addr)
	r.notify()
}

// failed records that addr's step failed: it keeps its permit (it is probably down) and
// the group's rollout stops until it is repaired and verified.
func (r *Rollouts) failed(addr, member string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.inFlight[addr]
	if !ok {
		return
	}
	// The first line quotes the failure (a launch's log line); the failed step's own
	// report carries the rest (the log's tail), which each skipped member would repeat.
	quote, _, _ := strings.Cut(strings.TrimPrefix(err.Error(), addr+": "), "\n")
	m.Failed, m.Member = strings.TrimSuffix(strings.TrimSpace(quote), ":"), member
	r.inFlight[addr] = m
	_ = r.save() // in memory it stops this process's rollout either way
	if r.fleet != nil && r.groupName[addr] != "" {
		r.fleet.Fail(r.groupName[addr], addr, m.Failed)
	}
	r.tellFleet(addr)
	r.notify()
}

// prune forgets members in flight that are no longer in a group of the plan (their
// block was removed or left the group): they count for no group.
func (r *Rollouts) prune(members map[string]*plans.RolloutGroup) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.load(); err != nil {
		return err
	}
	r.keepFleet(members)
	n := len(r.inFlight)
	for a := range r.inFlight {
		if members[a] == nil {
			delete(r.inFlight, a)
		}
	}
	if len(r.inFlight) == n {
		return nil
	}
	return r.save()
}

// RolloutError is the error of a group member whose disruption the rollout did not
// start: the rollout stopped at a failed member, or the group is at max_unavailable.
type RolloutError struct {
	Group string
	Max   int
	// Stopped: Cause failed (on cluster member Member, or on another host Host, with
	// Reason) and the group's rollout stops until it is repaired.
	Stopped bool
	Cause   string
	Member  string
	Host    string
	Reason  string
	// Waiting: the reconcile loop tries again when a member of the group changes; the
	// resource did nothing, so nothing failed.
	Waiting  bool
	blockers []blocker
}

func (e *RolloutError) Error() string {
	if e.Stopped {
		on := ""
		if e.Member != "" {
			on = " (member " + e.Member + ")"
		}
		if e.Host != "" {
			on = " (host " + e.Host + ")"
		}
		return fmt.Sprintf("rollout %s stopped: %s failed%s: %s", e.Group, e.Cause, on, e.Reason)
	}
	var parts []string
	for _, b := range e.blockers {
		if b.why == "" {
			parts = append(parts, b.addr)
			continue
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", b.addr, b.why))
	}
	verb := "not started"
	if e.Waiting {
		verb = "waiting"
	}
	return fmt.Sprintf("rollout %s: %s: max_unavailable = %d and %s unavailable: %s", e.Group, verb, e.Max,
		plural(len(parts), "member is", "members are"), strings.Join(parts, ", "))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// IsRolloutWait reports whether err is a rollout's "not now" to the reconcile loop: the
// resource waits for its group, it did not fail.
func IsRolloutWait(err error) bool {
	var re *RolloutError
	return errors.As(err, &re) && re.Waiting
}

// RolloutPeers returns the other members of addr's rollout group: a loop tries its held
// members again when one of them changes.
func (e *Engine) RolloutPeers(addr string) []string {
	g := e.groupOf[addr]
	if g == nil {
		return nil
	}
	var out []string
	for _, m := range g.Members {
		if m != addr {
			out = append(out, m)
		}
	}
	return out
}

// initRollouts finds the plan's rollout groups (New).
func (e *Engine) initRollouts() {
	e.groupOf = map[string]*plans.RolloutGroup{}
	for _, g := range e.plan.RolloutGroups() {
		g := g
		for _, m := range g.Members {
			if _, ok := e.resources[m]; ok {
				e.groupOf[m] = &g
			}
		}
	}
	if len(e.groupOf) == 0 {
		return
	}
	if e.opts.Rollouts == nil || e.opts.Rollouts.store.Dir() != e.store.Dir() {
		e.opts.Rollouts = NewRollouts(e.store)
	}
	e.rollouts = e.opts.Rollouts
	names := map[string]string{}
	for a, g := range e.groupOf {
		names[a] = g.Name
	}
	e.rollouts.setGroups(names)
}

// observeMembers observes every rollout member not observed yet, concurrently, before an
// apply acts: a member already down must count before a healthy one is disrupted, even
// when the walk reaches the healthy one first.
func (e *Engine) observeMembers(ctx context.Context) error {
	if e.rollouts == nil {
		return nil
	}
	if err := e.rollouts.prune(e.groupOf); err != nil {
		return err
	}
	sem := make(chan struct{}, e.opts.Parallelism)
	var wg sync.WaitGroup
	for addr := range e.groupOf {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			e.observe(ctx, addr)
		}()
	}
	wg.Wait()
	return nil
}

// applyRun is one Apply's view of its own progress, for the rollout's waits: whether a
// member that holds its group at the limit may still change in this apply.
type applyRun struct {
	graph *dag.Graph
	// slots bound the steps that act at once (Options.Parallelism); a member waiting for
	// its group gives its slot back, so waiting members never starve the step they wait
	// for.
	slots chan struct{}
	mu    sync.Mutex
	done  map[string]error
}

// stepDone records that addr's step of the apply ended, with its error.
func (r *applyRun) stepDone(addr string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done[addr] = err
}

// pending reports whether addr may still act in this apply: it is in the walk, not done,
// and nothing it depends on failed.
func (r *applyRun) pending(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.graph.Has(addr) {
		return false
	}
	seen := map[string]bool{}
	var blocked func(a string) bool
	blocked = func(a string) bool {
		if seen[a] {
			return false
		}
		seen[a] = true
		if err, ok := r.done[a]; ok {
			return a == addr || err != nil
		}
		for _, d := range r.graph.Deps(a) {
			if blocked(d) {
				return true
			}
		}
		return false
	}
	return !blocked(addr)
}

// ready reports whether addr is pending and every dependency of it succeeded: it acts
// (or waits at its group's gate) without waiting for anything else.
func (r *applyRun) ready(addr string) bool {
	if !r.pending(addr) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.graph.Deps(addr) {
		if err, ok := r.done[d]; !ok || err != nil {
			return false
		}
	}
	return true
}

// hopeless reports whether a refusal cannot change in this apply: the failed member, or
// enough of the unavailable ones, will not act again before it ends.
func (r *applyRun) hopeless(re *RolloutError) bool {
	if re.Stopped {
		return re.Host != "" || !r.pending(re.Cause)
	}
	stuck := 0
	for _, b := range re.blockers {
		if !b.remote && !r.pending(b.addr) {
			stuck++
		}
	}
	return stuck >= re.Max
}

// gate is where a rollout member waits its turn before it acts. It returns the diff to
// act on (observed again after a wait: never stale), and fresh when it took a new permit.
// Without a run (the reconcile loop) it never waits: a refusal is returned as a Waiting
// RolloutError and the loop tries again when a member of the group changes.
func (e *Engine) gate(ctx context.Context, run *applyRun, addr string, d *Diff) (*Diff, bool, error) {
	g := e.groupOf[addr]
	if g == nil || e.destroying {
		return d, false, nil
	}
	lastWhy := ""
	for {
		if _, down := d.Unavailable(); d.Action == NoOp || !d.Action.Destructive() && !down {
			return d, false, nil // an in-place change interrupts nothing
		}
		var pending func(string) bool
		if run != nil {
			// A member declared first goes first once it can act: a member still
			// waiting for its dependencies goes when they are done.
			pending = run.ready
		}
		fresh, refusal, changed, err := e.rollouts.admit(ctx, g, addr, d.Action, pending)
		if err != nil {
			return d, false, fmt.Errorf("%s: rollout %s: %w", addr, g.Name, err)
		}
		if refusal == nil {
			if fresh {
				e.log.Info("rollout: disrupting a member", "resource", addr, "group", g.Name, "action", string(d.Action))
			}
			return d, fresh, nil
		}
		if run == nil {
			refusal.Waiting = true
			return d, false, refusal
		}
		if run.hopeless(refusal) {
			return d, false, refusal
		}
		if why := refusal.Error(); why != lastWhy {
			// Waiting on other hosts can be long: an apply's operator sees it (warn).
			level := slog.LevelInfo
			if refusal.remote() {
				level = slog.LevelWarn
			}
			e.log.Log(ctx, level, "rollout: waiting for the group", "resource", addr, "group", g.Name, "why", why)
			lastWhy = why
		}
		<-run.slots
		select {
		case <-changed:
		case <-ctx.Done():
		case <-fleetPoll(e.rollouts):
		}
		run.slots <- struct{}{} // taken again; the step gives it back as it ends
		if ctx.Err() != nil {
			return d, false, ctx.Err()
		}
		if d, err = e.observe(ctx, addr); err != nil {
			return d, false, err
		}
	}
}

// rolloutFailed records a member's failed step: its group's rollout stops there.
func (e *Engine) rolloutFailed(ctx context.Context, addr string, err error) {
	if e.groupOf[addr] == nil || e.rollouts == nil {
		return
	}
	member := ""
	if s, ok := e.resources[addr].(Statuser); ok {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		func() {
			defer func() { _ = recover() }()
			if st, serr := s.Status(ctx, e.env(addr)); serr == nil {
				member = st.Member()
			}
		}()
	}
	e.rollouts.failed(addr, member, err)
}

// RolloutSummary is what a plan says about a rollout group: how many of its members the
// apply disrupts, and at most how many at a time.
type RolloutSummary struct {
	Group          string `json:"group"`
	MaxUnavailable int    `json:"max_unavailable"`
	Members        int    `json:"members"`
	// Disruptions counts the members' restarts, replaces and deletes.
	Disruptions Summary `json:"disruptions"`
	// Down are members observed down: they count as unavailable until repaired.
	Down []string `json:"down"`
}

// rolloutSummaries summarises a report's steps by rollout group.
func (e *Engine) rolloutSummaries(rep *Report) []RolloutSummary {
	var out []RolloutSummary
	for _, g := range e.plan.RolloutGroups() {
		s := RolloutSummary{Group: g.Name, MaxUnavailable: g.MaxUnavailable, Members: len(g.Members), Down: []string{}}
		for _, st := range rep.Steps {
			if e.groupOf[st.Addr] == nil || e.groupOf[st.Addr].Name != g.Name || st.Diff == nil {
				continue
			}
			if _, down := st.Diff.Unavailable(); down {
				s.Down = append(s.Down, st.Addr)
			} else if st.Diff.Action.Destructive() {
				s.Disruptions.count(st.Diff.Action)
			}
		}
		out = append(out, s)
	}
	return out
}

// String is the plan's line for the group: "rollout qwen: 3 restarts, 1 at a time".
func (s RolloutSummary) String() string {
	var parts []string
	for _, p := range []struct {
		n          int
		one, other string
	}{{s.Disruptions.Restart, "restart", "restarts"}, {s.Disruptions.Replace, "replace", "replaces"}, {s.Disruptions.Delete, "delete", "deletes"}} {
		if p.n == 1 {
			parts = append(parts, "1 "+p.one)
		} else if p.n > 1 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.other))
		}
	}
	line := fmt.Sprintf("rollout %s: %s, %d at a time", s.Group, strings.Join(parts, ", "), s.MaxUnavailable)
	if len(s.Down) > 0 {
		line += fmt.Sprintf("; %s down (repaired first, counted as unavailable)", strings.Join(s.Down, ", "))
	}
	return line
}
