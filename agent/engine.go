package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/dag"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// DefaultStepTimeout bounds one resource's Check or Apply unless the resource says
// otherwise (Timeouter).
const DefaultStepTimeout = 10 * time.Minute

// DefaultParallelism is how many resources are observed or applied at once.
const DefaultParallelism = 4

// Options tune an Engine.
type Options struct {
	// Parallelism bounds concurrent steps (DefaultParallelism when < 1).
	Parallelism int
	// Targets limit the run to these addresses and what they depend on.
	Targets []string
	// StepTimeout is the default bound of one step (DefaultStepTimeout when zero).
	StepTimeout time.Duration
	// Log receives the engine's and the resources' structured logs (discarded when nil).
	Log *slog.Logger
	// Hostname is this host's name, for the plan's host guard (os.Hostname when empty).
	Hostname string
	// HostOverride lets a plan guarded for another host run here: the intended step of a
	// migration. It must equal the plan's host.hostname, so it is never a blanket bypass.
	HostOverride string
	// NoDestructive refuses restarts, replacements and deletions.
	NoDestructive bool
	// Progress receives what long steps report of their work (Env.Progress: a
	// download's bytes, rate and ETA), from the goroutine of the step; nil: nobody
	// listens. The views draw it (internal/view); the engine only passes it on.
	Progress func(Progress)
	// Orphans says what happens to resources recorded in state whose blocks are gone from
	// the plan. The zero value (OrphansByPlan, agent run) deletes them only when the plan
	// says agent { prune = true } and otherwise reports them; plan and apply use
	// OrphansDelete.
	Orphans OrphanMode
	// AllowDeleteAll lets an apply delete every resource of a guarded kind (Kind.Guarded:
	// every server) while the plan keeps none (--allow-delete-all).
	AllowDeleteAll bool
	// Probe is passed to resources as Env.Probe: status runs its costly probes
	// (`agent status --smoke`).
	Probe bool
	// Loop is passed to resources as Env.Loop: the reconcile loop (`agent run`) runs
	// this engine, not a person's plan or apply.
	Loop bool
	// Hold, when set, is asked before each resource is observed and again right before it
	// is acted on; a non-nil error fails the step with that error without touching the
	// resource (and skips its dependents). The reconcile loop uses it for per-resource
	// backoff and, once it is stopping, to start no new action while it observes.
	Hold func(addr string) error
	// Rollouts are the rollout permits of the state directory, shared by every engine of
	// a process (the reconcile loop's, one per plan reload) so that they count the same
	// disruptions. Nil: the engine makes its own when the plan has rollout groups.
	Rollouts *Rollouts
	// Memory is what the kinds remember between steps (Env.Memory), shared by every
	// engine of a process that runs the loop. Nil: the engine makes its own.
	Memory *Memory
	// StepContext, when set, derives the context of each guarded step of a resource
	// (observe, apply, status) from the run's: how a caller hears, per address, of what a
	// step reports through its context (a long stop's progress) without the engine
	// knowing what that is.
	StepContext func(ctx context.Context, addr string) context.Context
	// FingerprintKey, when set, makes Plan fingerprint every observation (Step.Fingerprint)
	// with digests keyed by it: the state directory's key, for a saved plan (agent plan
	// -out; agent/saved.go).
	FingerprintKey []byte
}

// Engine runs a bound plan against the host.
type Engine struct {
	plan      *plans.Plan
	resources map[string]Resource
	graph     *dag.Graph
	// full is the whole plan's graph, also under --target (graph is then the targets' closure).
	full  *dag.Graph
	store *state.Store
	opts  Options
	log   *slog.Logger
	kinds map[string]Kind
	// orphans are the addresses recorded in state but gone from the plan, in the order
	// they are deleted (dependents first); their resources are in resources.
	orphans []string
	// after maps an orphan that a planned resource's current record still depends on to
	// those resources: it is deleted only once they are verified (agent/wayback.go).
	after map[string][]string
	// movedFrom maps a moved block's new address to its old one.
	movedFrom map[string]string
	// refused are delete steps the delete-all guard refuses in this apply.
	refused map[string]error
	// destroying is set on the engine Destroy derives.
	destroying bool
	// groupOf maps each member of a rollout group to its group; rollouts are the permits
	// (nil when the plan has no group).
	groupOf  map[string]*plans.RolloutGroup
	rollouts *Rollouts
	// saved is the saved plan an ApplySaved applies: each step's observation must still
	// match its fingerprint (nil otherwise).
	saved *savedRun
}

// Bind binds every resource of a loaded plan to its kind. It touches nothing on the host,
// so `agent validate` uses it: its diagnostics are the kinds' own checks.
func Bind(p *plans.Plan, kinds []Kind) (map[string]Resource, hcl.Diagnostics) {
	byName := map[string]Kind{}
	for _, k := range kinds {
		byName[k.Name] = k
	}
	out := map[string]Resource{}
	var diags hcl.Diagnostics
	for _, r := range p.Resources {
		k, ok := byName[r.Type]
		if !ok {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Unknown resource kind",
				Detail: fmt.Sprintf("No kind %q is built into this agent.", r.Type), Subject: r.DeclRange.Ptr()})
			continue
		}
		if r.Config == nil {
			continue // its decoding failed and was reported
		}
		res, d := k.Bind(r)
		if r.Partial() {
			// Values an error left unknown decoded as zero: only the kind's checks of one
			// value written out in full mean anything (plans.OwnValue).
			d = slices.DeleteFunc(d, func(d *hcl.Diagnostic) bool { return d.Extra != plans.OwnValue || !plans.Outside(d, r.Unknown) })
			res = nil
		}
		diags = append(diags, d...)
		if res != nil && !d.HasErrors() {
			out[r.Addr] = res
		}
	}
	return out, diags
}

// New binds a plan and prepares an engine over the state store. The plan must have loaded
// without errors.
func New(p *plans.Plan, kinds []Kind, store *state.Store, opts Options) (*Engine, error) {
	resources, diags := Bind(p, kinds)
	if diags.HasErrors() {
		return nil, diags
	}
	g := &dag.Graph{}
	for _, r := range p.Resources {
		g.Add(r.Addr)
		for _, d := range r.DependsOn {
			g.Depend(r.Addr, d)
		}
	}
	full := g
	if len(opts.Targets) > 0 {
		sub, err := g.Closure(opts.Targets)
		if err != nil {
			return nil, fmt.Errorf("--target: %w", err)
		}
		g = sub
	}
	if opts.Parallelism < 1 {
		opts.Parallelism = DefaultParallelism
	}
	if opts.StepTimeout <= 0 {
		opts.StepTimeout = DefaultStepTimeout
	}
	if opts.Memory == nil {
		opts.Memory = NewMemory()
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{plan: p, resources: resources, graph: g, full: full, store: store, opts: opts, log: log, kinds: map[string]Kind{}, movedFrom: map[string]string{}}
	for _, k := range kinds {
		e.kinds[k.Name] = k
	}
	for _, m := range p.Moved {
		e.movedFrom[m.To] = m.From
	}
	if err := e.checkHost(); err != nil {
		return nil, err
	}
	e.initRollouts()
	if err := e.findOrphans(); err != nil {
		return nil, err
	}
	return e, nil
}

// ErrWrongHost is returned when the plan's host guard names another host.
var ErrWrongHost = errors.New("wrong host")

func (e *Engine) checkHost() error {
	want := e.plan.Host.Hostname
	if want == "" {
		return nil
	}
	have := e.opts.Hostname
	if have == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("host guard: %w", err)
		}
		have = h
	}
	if have == want {
		return nil
	}
	if e.opts.HostOverride == want {
		e.log.Warn("host guard overridden", "plan_host", want, "this_host", have)
		return nil
	}
	return fmt.Errorf("%w: this plan is for host %q (%s) and this is %q; if this is the intended migration step, pass --host-override %s",
		ErrWrongHost, want, e.plan.Host.DeclRange, have, want)
}

// Order returns the addresses the engine acts on, in dependency order.
func (e *Engine) Order() []string {
	order, _ := e.graph.Sort() // acyclic: the plan loader rejected cycles
	return order
}

// env is what addr's Apply, Finish, Status and Watch get: its own record, writable.
func (e *Engine) env(addr string) *Env {
	return &Env{Addr: addr, State: e.stateFor(addr), Log: e.log.With("resource", addr), Plan: e.plan, Now: time.Now, Probe: e.opts.Probe, Loop: e.opts.Loop, OnProgress: e.opts.Progress, Memory: e.opts.Memory}
}

// observeEnv is what addr's Check gets: its own record, read-only. What the observation
// found the record must say comes back in the diff (Diff.Record), and keep writes it.
func (e *Engine) observeEnv(addr string) *Env {
	env := e.env(addr)
	env.State = env.State.ReadOnly()
	return env
}

// Budget bounds how long one Apply of the whole plan can take: every step's observe, act
// and verify, one after another, each under its timeout. The reconcile loop takes a pass
// that runs longer for a hung agent; one that runs long within it (a 52 GB download, a
// driver install) is working.
func (e *Engine) Budget() time.Duration {
	var b time.Duration
	for addr := range e.resources {
		b += 3 * e.timeout(addr)
	}
	return b
}

func (e *Engine) timeout(addr string) time.Duration {
	if t, ok := e.resources[addr].(Timeouter); ok && t.Timeout() > 0 {
		return t.Timeout()
	}
	return e.opts.StepTimeout
}

// guard runs fn under the step timeout and turns a panic into an error, so one broken
// resource cannot take the agent (and every other resource's apply) down with it.
func (e *Engine) guard(ctx context.Context, addr, what string, fn func(ctx context.Context) error) (err error) {
	limit := e.timeout(addr)
	notePhase(ctx, addr, what, limit)
	if e.opts.StepContext != nil {
		ctx = e.opts.StepContext(ctx, addr)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			e.log.Error("panic", "resource", addr, "step", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = fmt.Errorf("%s: %s: internal error (panic: %v); this is a bug in the agent, please report it with the log", addr, what, p)
		}
	}()
	began := time.Now()
	err = fn(ctx)
	if err == nil {
		return nil
	}
	// Which deadline expired: the step's own (its context's, at its limit), or one
	// within the step (an HTTP client's, a probe's) long before it, which must not be
	// labelled with the step's whole limit (issue 27: "did not finish within 4m18s"
	// 20 s into the step).
	ran := time.Since(began)
	expired := errors.Is(ctx.Err(), context.DeadlineExceeded)
	stepExpired := expired && ran >= limit-limit/100 // the step's own, not its caller's
	switch {
	case stepExpired && !errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("%w (step timeout %s)", err, limit)
	case stepExpired:
		err = fmt.Errorf("%s: %s: did not finish within %s: %w", addr, what, limit, err)
	case expired:
		err = fmt.Errorf("%s: %s: its caller's deadline expired after %s (the step's own timeout, %s, had not passed): %w",
			addr, what, ran.Round(100*time.Millisecond), limit, err)
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("%s: %s: a deadline within the step expired after %s (the step's own timeout, %s, had not passed): %w",
			addr, what, ran.Round(100*time.Millisecond), limit, err)
	}
	return err
}

// check runs one resource's Check, which reads its own record and writes nothing, and
// prefixes its errors with the address. Its record update, if any, is in the diff: plan
// and status drop it; apply and the reconcile loop keep it (observe).
func (e *Engine) check(ctx context.Context, addr string) (*Diff, error) {
	var d *Diff
	err := e.guard(ctx, addr, "observe", func(ctx context.Context) error {
		var err error
		d, err = e.resources[addr].Check(ctx, e.observeEnv(addr))
		return err
	})
	if err != nil {
		return nil, withAddr(addr, "observe", err)
	}
	if d == nil {
		d = NoChange()
	}
	return d.Derive(), nil
}

// observe is check for apply and the loop, which act on what they observe: the record
// update is kept (keep), and a rollout group member's observation is counted (and
// verifies a member in flight).
func (e *Engine) observe(ctx context.Context, addr string) (*Diff, error) {
	return e.observeVetted(ctx, addr, nil)
}

// observeVetted is observe with vet, when not nil, asked about the diff before anything
// of it is kept: a saved plan's step refuses an observation that no longer matches its
// fingerprint without writing even its record.
func (e *Engine) observeVetted(ctx context.Context, addr string, vet func(*Diff) error) (*Diff, error) {
	d, err := e.check(ctx, addr)
	if err == nil && vet != nil {
		if err = vet(d); err != nil {
			d = nil
		}
	}
	if err == nil {
		if err = e.keep(addr, d); err != nil {
			d = nil
		}
	}
	if e.groupOf[addr] != nil {
		e.rollouts.observed(addr, d, err)
	}
	return d, err
}

// keep writes the record update an observation of addr returned: the one place where
// what a Check found reaches the state directory, under the state lock that apply and
// agent run hold. An apply keeps it before acting on the diff, whatever its action (the
// time a server was first found not ready is kept while it stays within its grace).
func (e *Engine) keep(addr string, d *Diff) error {
	if d == nil || d.Record == nil {
		return nil
	}
	st := e.stateFor(addr)
	var err error
	if d.Record.Value == nil {
		err = st.Delete()
	} else {
		err = st.Save(d.Record.Value)
	}
	if err != nil {
		return fmt.Errorf("%s: record what was observed (%s): %w", addr, d.Record.Why, err)
	}
	// A judgement is said once: the same finding kept again (a pass that could not act
	// on it yet) is a debug line.
	level := slog.LevelInfo
	if was, ok := e.opts.Memory.Load("engine recorded " + addr); ok && was == d.Record.Why {
		level = slog.LevelDebug
	}
	e.opts.Memory.Store("engine recorded "+addr, d.Record.Why)
	e.log.Log(context.Background(), level, "recorded", "resource", addr, "what", d.Record.Why)
	return nil
}

// withAddr prefixes err with the resource address unless it already starts with it.
func withAddr(addr, what string, err error) error {
	msg := err.Error()
	if len(msg) >= len(addr) && msg[:len(addr)] == addr {
		return err
	}
	return fmt.Errorf("%s: %s: %w", addr, what, err)
}

func (e *Engine) newReport() (*Report, map[string]*Step) {
	rep := &Report{}
	byAddr := map[string]*Step{}
	for _, a := range e.addrs() {
		st := &Step{Addr: a, Orphan: e.isOrphan(a), MovedFrom: e.movedFrom[a], DeletedAfter: e.after[a]}
		rep.Steps = append(rep.Steps, st)
		byAddr[a] = st
	}
	return rep, byAddr
}

// Plan observes every resource, concurrently, and returns their diffs. It changes nothing.
func (e *Engine) Plan(ctx context.Context) *Report {
	rep, byAddr := e.newReport()
	e.each(ctx, func(ctx context.Context, addr string) {
		st := byAddr[addr]
		start := time.Now()
		st.Diff, st.Err = e.check(ctx, addr)
		if st.Err == nil && e.opts.FingerprintKey != nil {
			fp, err := e.fingerprint(addr, st.Diff)
			st.Fingerprint, st.Err = &fp, err
		}
		st.Duration = time.Since(start)
	})
	if e.rollouts != nil {
		rep.Rollouts = e.rolloutSummaries(rep)
	}
	return rep
}

// each runs fn on every resource with bounded parallelism, ignoring dependencies
// (observation needs no order).
func (e *Engine) each(ctx context.Context, fn func(ctx context.Context, addr string)) {
	sem := make(chan struct{}, e.opts.Parallelism)
	var wg sync.WaitGroup
	for _, addr := range e.addrs() {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			fn(ctx, addr)
		}()
	}
	wg.Wait()
}

// Event reports progress of an apply as it happens, for live output.
type Event struct {
	Step *Step
	// Phase is PhaseStart (Diff known, about to act), PhaseDone (Err/Applied final), or
	// PhaseFinished (the break work of a Finisher done and verified: Step.Finished).
	Phase Phase
}

// ErrNotConverged is wrapped by the error of a resource that Apply reported done but a
// fresh Check still finds different.
var ErrNotConverged = errors.New("host still differs after apply")

// ErrDestructiveRefused is returned for a destructive step under NoDestructive.
var ErrDestructiveRefused = errors.New("destructive change refused by --no-destructive")

// Apply walks the graph in dependency order. For each resource it checks the host afresh,
// applies the diff when there is one, and checks again to verify. A failure skips the
// resource's dependents (reported with the root cause) and lets independent resources
// continue. onEvent, when not nil, is called as steps start and end (serially).
func (e *Engine) Apply(ctx context.Context, onEvent func(Event)) *Report {
	rep, byAddr := e.newReport()
	var evMu sync.Mutex
	emit := func(st *Step, phase string) {
		if onEvent == nil {
			return
		}
		evMu.Lock()
		defer evMu.Unlock()
		onEvent(Event{Step: st, Phase: Phase(phase)})
	}
	if err := e.move(); err != nil {
		for _, st := range rep.Steps {
			st.Err = err
		}
		return rep
	}
	if !e.opts.AllowDeleteAll && !e.destroying {
		e.refused = e.guardDeleteAll(ctx)
	}
	walkers := e.opts.Parallelism
	var run *applyRun
	if e.rollouts != nil && !e.destroying {
		if err := e.observeMembers(ctx); err != nil {
			for _, st := range rep.Steps {
				st.Err = err
			}
			return rep
		}
		// Members waiting for their group give their slot back (applyRun.slots), so
		// the walk may hold one more goroutine per member than steps that act.
		run = &applyRun{graph: e.graph, slots: make(chan struct{}, e.opts.Parallelism), done: map[string]error{}}
		walkers += len(e.groupOf)
	}
	step := func(ctx context.Context, addr string) error {
		st := byAddr[addr]
		if run != nil {
			select {
			case run.slots <- struct{}{}:
			case <-ctx.Done():
				return dag.ErrNotRun
			}
			defer func() {
				<-run.slots
				run.stepDone(addr, st.Err)
				e.rollouts.poke()
			}()
		}
		start := time.Now()
		st.Err = e.applyOne(ctx, st, func() { emit(st, "start") }, run)
		st.Duration = time.Since(start)
		if st.Err != nil || st.Applied {
			emit(st, "done")
		}
		return st.Err
	}
	// Orphans first, one at a time, dependents first: what they hold (a port, GPU
	// memory, a container) is often what the plan's resources need. Those that what
	// serves now still needs wait until after the walk (deleteAfter).
	for _, addr := range e.orphans {
		if len(e.after[addr]) > 0 {
			continue
		}
		if ctx.Err() != nil {
			byAddr[addr].Err = ctx.Err()
			continue
		}
		step(ctx, addr)
	}
	results, err := e.graph.Walk(ctx, walkers, step)
	if err != nil {
		// The loader rejects cycles, so this cannot happen with a loaded plan.
		for _, st := range rep.Steps {
			st.Err = err
		}
		return rep
	}
	for _, st := range rep.Steps {
		if res := results[st.Addr]; st.Err == nil && res != nil {
			// Skipped, or never run because ctx ended: the walk's error, named for
			// the resource as every step error is.
			st.Err = fmt.Errorf("%s: %w", st.Addr, res)
			emit(st, "done")
		}
	}
	e.deleteAfter(ctx, byAddr, step)
	if !e.destroying {
		e.finishAll(ctx, byAddr, emit)
	}
	e.saveDeps(rep)
	return rep
}

// applyOne is one resource's part of Apply: check, act, verify. run is the apply's
// progress, for a rollout member's wait (nil in the reconcile loop, which never waits).
func (e *Engine) applyOne(ctx context.Context, st *Step, started func(), run *applyRun) error {
	addr := st.Addr
	if e.opts.Hold != nil {
		if err := e.opts.Hold(addr); err != nil {
			return err
		}
	}
	d, err := e.observeVetted(ctx, addr, e.saved.vet(e, addr))
	st.Diff = d
	if err != nil {
		return err
	}
	st.Unfinished = d.Unfinished
	if d.Action == NoOp {
		return nil
	}
	if st.Orphan && !e.pruning() {
		d.Warnings = append(d.Warnings, "not deleted: it is no longer in the plan, and agent run deletes orphans only with agent { prune = true } (agent apply deletes it)")
		e.log.Warn("orphan not deleted", "resource", addr, "action", string(d.Action))
		return nil
	}
	if e.opts.NoDestructive && d.Action.Destructive() {
		return fmt.Errorf("%s: %s: %w", addr, d.Action, ErrDestructiveRefused)
	}
	if err := e.refused[addr]; err != nil && d.Action == Delete {
		return fmt.Errorf("%s: %s: %w", addr, d.Action, err)
	}
	d, fresh, err := e.gate(ctx, run, addr, d)
	st.Diff = d
	if d != nil {
		st.Unfinished = d.Unfinished
	}
	if err != nil || d.Action == NoOp {
		return err
	}
	if e.opts.Hold != nil {
		// Observation takes time (a readiness probe, a Hub request): what held nothing
		// then may hold the action now (the agent began to stop meanwhile).
		if err := e.opts.Hold(addr); err != nil {
			if fresh {
				e.rollouts.release(addr)
			}
			return err
		}
	}
	started()
	// The changes with their effects and reasons: a restart in the journal says why (a
	// rotated token is `env["HF_TOKEN"]`, its value never printed). They are logged as
	// data; the log's view (view.RedactingHandler) writes them as one line or as JSON.
	e.log.Info("applying", "resource", addr, "action", string(d.Action), "changes", d.Changes)
	err = e.guard(ctx, addr, string(d.Action), func(ctx context.Context) error {
		return e.resources[addr].Apply(ctx, e.env(addr), d)
	})
	if err != nil {
		err = withAddr(addr, string(d.Action), err)
		e.rolloutFailed(ctx, addr, err)
		return err
	}
	e.forgetDestroyed(addr)
	after, err := e.observe(ctx, addr)
	if err != nil {
		err = fmt.Errorf("%w (while verifying the apply)", err)
		e.rolloutFailed(ctx, addr, err)
		return err
	}
	if after.Action != NoOp {
		err := fmt.Errorf("%s: verify: %w: %s", addr, ErrNotConverged, describe(after))
		e.rolloutFailed(ctx, addr, err)
		return err
	}
	st.Applied, st.Unfinished = true, after.Unfinished
	d.Held = after.Held // verified on what it holds, not on the plan's inputs
	e.saved.applied(addr)
	e.log.Info("applied and verified", "resource", addr, "action", string(d.Action))
	return nil
}

func describe(d *Diff) string {
	var attrs []string
	for _, c := range d.Changes {
		attrs = append(attrs, c.Attr)
	}
	sort.Strings(attrs)
	if len(attrs) == 0 {
		return string(d.Action)
	}
	return fmt.Sprintf("%s of %v", d.Action, attrs)
}

// Status observes every resource and returns its live status: the resource's own Status
// when it has one, otherwise "matches the plan" or the drift Check finds.
func (e *Engine) Status(ctx context.Context) *Report {
	rep, byAddr := e.newReport()
	e.each(ctx, func(ctx context.Context, addr string) {
		*byAddr[addr] = *e.StatusOf(ctx, addr, nil)
	})
	return rep
}
