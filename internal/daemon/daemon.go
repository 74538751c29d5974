// Package daemon is `agent run`: the reconcile loop that keeps a host converged, with
// systemd notification, per-resource backoff, and Prometheus metrics and live status on a
// loopback HTTP endpoint.
//
// The loop reconciles each resource on its own clock (controller-runtime's model): a
// work queue keyed by resource address feeds a few workers; each reconcile observes the
// host afresh (never trusting a remembered event), acts, and verifies. A resource is
// queued at start, at its own resync interval, when the plan changes, when a dependency
// converges, and the moment its Watcher notices a change (a launched server's process
// exited), so a crashed server is relaunched in seconds whatever else runs: a 52 GB
// download or a driver install holds only the resources that depend on it. A resource
// acts only when each of its dependencies last verified converged. One that fails waits
// a jittered exponential backoff (capped, reset once it has been stable for a while), so
// a crash loop neither spins nor blocks the others; a terminal error waits until the
// plan changes or the host moves under it. A plan that stops parsing is reported and the
// last good plan keeps running; nothing the old plan built is torn down. The daemon
// holds the state lock for its whole life, so a manual `agent apply` cannot fight it.
// Stopping the agent never stops what it manages.
package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/drain"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
)

// Defaults of the agent block and of the loop.
const (
	DefaultInterval = 30 * time.Second
	DefaultListen   = "127.0.0.1:9464"
	// DefaultBackoffMin and DefaultBackoffMax bound a failing resource's wait.
	DefaultBackoffMin = 5 * time.Second
	DefaultBackoffMax = 10 * time.Minute
	// DefaultStable is how long a resource must stay verified before its failure count
	// resets: a server that dies a minute after each verified launch is a crash loop,
	// and each relaunch waits longer.
	DefaultStable = 2 * time.Minute
	// DefaultStuckGrace is how long a step may run past its own timeout before the
	// watchdog and /healthz call the loop stuck.
	DefaultStuckGrace = time.Minute
	debounce          = 500 * time.Millisecond
	// historyLen is how many failures a resource's status keeps (each generation's quote).
	historyLen = 5
	// watchRefire is the least time between two reconciles a Watcher triggers.
	watchRefire = time.Second
)

// Config is what Run needs. Load returns the plan bound to Kinds (diagnostics on error).
type Config struct {
	PlanPath string
	Load     func() (*plans.Plan, hcl.Diagnostics)
	Kinds    []agent.Kind
	// HostGate, when set, is the host-permit hook the Kinds' machine holds
	// (Machine.HostDisruption): joining the fleet attaches it, and the loop releases at
	// boot a host permit its host recorded (driver upgrade, reboot) once verified.
	HostGate *fleet.HostGate
	// BootID reads this boot's id (for the host permit's release after a reboot).
	BootID func() string
	// StateDir overrides the plan's agent.state_dir.
	StateDir string
	// Interval and Listen override the plan's agent block when set. The interval is each
	// resource's resync period.
	Interval time.Duration
	Listen   string
	// Engine options (Parallelism: the number of workers, HostOverride, Log…); Hold is
	// set by Run.
	Engine agent.Options
	Log    *slog.Logger
	// Notify sends one sd_notify datagram; nil sends to $NOTIFY_SOCKET (nothing outside
	// systemd). Tests record the datagrams instead.
	Notify func(state string) error
	// LockTimeout bounds the wait at start for an operator's command that holds the
	// state lock; past it Run fails (systemd restarts it). Zero waits as long as it takes.
	LockTimeout time.Duration
	// Ready, when not nil, receives the listen address once the HTTP endpoint is up.
	Ready func(addr string)
	// StopGrace bounds how long the steps in flight may run after SIGTERM (default 90 s,
	// under the unit's TimeoutStopSec): no new step starts, the current ones finish.
	StopGrace time.Duration
	// BackoffMin, BackoffMax, Stable and StuckGrace tune the loop (the Default* values
	// when zero); tests shorten them.
	BackoffMin, BackoffMax, Stable, StuckGrace time.Duration
	// StopProgress is how often a stop that waits for a server to exit is logged
	// (DefaultStopProgress when zero).
	StopProgress time.Duration
	// ProgressEvery is how often long work (a download) logs where it stands: bytes,
	// rate, ETA (view.DefaultProgressEvery when zero).
	ProgressEvery time.Duration
	// LoadTimeout bounds one load of the plan (DefaultLoadTimeout when zero): a load
	// past it is abandoned, and the last good plan keeps running.
	LoadTimeout time.Duration
	// Version is the agent's version, for the start line; StartAttrs are what the caller
	// adds to it (whether servers run in systemd units: the loop knows no kind).
	Version    string
	StartAttrs []slog.Attr
}

// Daemon is a running reconcile loop.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	redact  *view.RedactingHandler // d.log's, given each loaded plan's secrets
	notify  notifier
	metrics *metrics
	// progress says when long work's next progress line is due in the log.
	progress view.ProgressLines
	queue    *workQueue
	// work is the workers' context: it ends only after the stop grace.
	work context.Context

	// stopping is set on SIGTERM: no new step starts.
	stopping atomic.Bool
	// observing: a live observation of the resources in flight runs (inflight.go).
	observing atomic.Bool

	// memory is what the kinds remember between steps, across the engines of plan
	// reloads (agent.Memory).
	memory *agent.Memory

	mu       sync.Mutex
	plan     *plans.Plan
	planHash [32]byte
	store    *state.Store
	eng      *agent.Engine // the loop's engine: one per accepted plan, its clients reused
	engGen   int           // counts accepted plans: results of an older engine are stale
	shape    *shape        // eng's addresses and dependents, computed once per engine
	// standing is each resource's category for STATUS= and the counts of each, kept as
	// resources change (publish): a publish costs O(changes), not O(resources).
	standing map[string]category
	counts   [nCategories]int
	res      map[string]*resState
	running  bool      // the state lock is held and the workers run
	waiting  string    // why the loop does not run yet (the lock's holder)
	lastErr  string    // the last plan load error, reported while the old plan runs
	summary  string    // the last STATUS= sent
	reloaded time.Time // when the current plan was accepted
	loading  time.Time // when the load in flight began (zero: none)
	// goodInputs and triedInputs are the files the last good plan and the last load
	// read: all are watched. inputsChanged tells the watch to follow them.
	goodInputs, triedInputs []string
	inputsChanged           chan struct{}
	loadedStamp             string // the inputs' stat after the last load (inputStamp)
	// rollouts are the rollout groups' permits, shared by every engine of the loop (one
	// per accepted plan) so that a reload never forgets a disruption in flight.
	rollouts *agent.Rollouts
	// published is poked (never blocking) whenever publish refreshed what the loop shows:
	// a host permit's release asks again then (finishHost), not an interval later.
	published chan struct{}
}

// resState is what the loop knows of one resource, carried across reloads by address.
type resState struct {
	// step is the last reconcile's outcome (Err: a failure, a hold, or a wait for a
	// dependency); status is the last status observation after it.
	step, status *agent.Step
	// converged: the last reconcile, by the engine of generation gen, verified it.
	converged bool
	gen       int
	done      time.Time // when the last reconcile ended

	// Backoff.
	failures int
	until    time.Time
	terminal bool
	holdSeen string    // a terminal hold's observation; another one lifts the hold
	verified time.Time // verified converged continuously since (zero: not converged)
	history  []failure // the last failures, oldest first

	// Repair.
	downSince time.Time // first found not converged (zero while converged)
	repairs   int
	lastFire  time.Time // the watch's last trigger

	// In flight.
	inFlight   bool
	phase      string
	phaseStart time.Time
	phaseLimit time.Duration
	// The action in flight (create, restart, …; "" when none), since when, and its
	// status observed meanwhile (inflight.go).
	action      string
	actionStart time.Time
	live        *agent.Step
	liveAt      time.Time
	progress    *agent.Progress // the action's latest progress (a download), if it reports any

	watchID     int
	watchCancel context.CancelFunc
	// unavailable: its last reconcile failed for something outside the agent
	// (agent.Unavailable); a change its watch notices ends the backoff.
	unavailable bool
}

type failure struct {
	at  time.Time
	err string
}

// stopWatch cancels the resource's watch, if any.
func (rs *resState) stopWatch() {
	if rs.watchCancel != nil {
		rs.watchCancel()
		rs.watchCancel = nil
	}
}

// Run runs the loop until ctx ends or SIGTERM/SIGINT arrives. It fails at once when the
// first plan is invalid (there is no last good plan to keep).
func Run(ctx context.Context, cfg Config) error {
	d := &Daemon{cfg: cfg, log: cfg.Log, notify: newNotifier(cfg.Notify), res: map[string]*resState{}, queue: newWorkQueue(), memory: cfg.Engine.Memory,
		published: make(chan struct{}, 1)}
	if d.memory == nil {
		d.memory = agent.NewMemory()
	}
	d.metrics = newMetrics(d)
	d.progress.Every = cfg.ProgressEvery
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	// Everything the daemon and the resources log goes through the plan's redactor,
	// renewed on each reload: an error may quote a secret, and the log is the journal.
	d.redact = view.NewRedactingHandler(d.log.Handler(), nil)
	d.log = slog.New(d.redact)
	if d.debugOn() {
		d.queue.trace = d.traceQueue
	}
	p, diags, err := d.loadNow(ctx)
	if err != nil {
		return err
	}
	if err := d.install(p, diags); err != nil {
		return err
	}

	sigCtx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Work runs under its own context: a signal stops new steps at once (stopping), and
	// cancels the steps in flight only after the grace period.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	d.work = work
	ctx = sigCtx
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	srv, addr, err := d.serve()
	if err != nil {
		return err
	}
	defer srv.Close()
	d.logStart(addr)
	if cfg.Ready != nil {
		cfg.Ready(addr)
	}

	// READY as soon as the endpoint serves: the first reconciles may take as long as a
	// 52 GB download, far past systemd's start timeout. STATUS= says what is going on.
	d.notify.ready("starting")
	lock, err := d.acquire(ctx)
	if err != nil {
		d.notify.stopping()
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return err
	}
	defer lock.Release()
	d.writeRunFile(addr)
	if err := d.eng.Prepare(ctx); err != nil {
		d.notify.stopping()
		return fmt.Errorf("plan %s: %w", cfg.PlanPath, err)
	}
	leave, err := d.joinFleet(ctx)
	if err != nil {
		d.notify.stopping()
		return fmt.Errorf("plan %s: %w", cfg.PlanPath, err)
	}
	defer leave()
	changed, closeWatch := d.watch(ctx)
	defer closeWatch()
	go d.watchdog(ctx)

	workers := cfg.Engine.Parallelism
	if workers < 1 {
		workers = agent.DefaultParallelism
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.worker()
		}()
	}
	d.mu.Lock()
	d.running = true
	for _, a := range d.shape.addrs {
		d.queue.Add(a)
	}
	d.mu.Unlock()
	d.publish()

	// A reload never waits for the steps in flight: the new plan is in place as soon as
	// it is loaded (each resource in flight is reconciled again under it when its step
	// ends), so READY=1 follows RELOADING=1 right away. The load itself runs beside the
	// loop, under a deadline: a file that blocks never holds a signal or a later edit.
	rl := d.newReloads()
	for {
		select {
		case <-ctx.Done():
			d.shutdown(&wg, cancelWork)
			return nil
		case <-hup:
			d.log.Info("SIGHUP: reloading the plan")
			rl.trigger()
		case <-changed:
			d.log.Info("plan file changed: reloading")
			rl.trigger()
		case r := <-rl.results:
			rl.done(r)
		case <-rl.timer.C:
			rl.expired()
		}
	}
}

// shutdown stops the loop: nothing new starts, the steps in flight get the grace period,
// then their context ends.
func (d *Daemon) shutdown(wg *sync.WaitGroup, cancelWork context.CancelFunc) {
	d.stopping.Store(true)
	d.notify.stopping()
	d.log.Info("stopping; managed servers keep running")
	d.queue.ShutDown()
	d.mu.Lock()
	for _, rs := range d.res {
		rs.stopWatch()
	}
	d.mu.Unlock()
	grace := d.cfg.StopGrace
	if grace <= 0 {
		grace = 90 * time.Second
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		d.log.Warn("the steps in flight did not finish within the stop grace period; interrupting them", "grace", grace.String())
		cancelWork()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
		}
	}
}

// acquire takes the state lock for the daemon's life, waiting as long as an operator's
// command holds it. Holding it for good (not per reconcile) is what keeps a manual
// `agent apply` from fighting the loop: such a command is refused at once, with a
// message naming this daemon (docs/service.md).
func (d *Daemon) acquire(ctx context.Context) (*state.Lock, error) {
	d.mu.Lock()
	store := d.store
	d.mu.Unlock()
	began := time.Now()
	for {
		lock, err := store.Acquire(ctx, 0, DaemonCommand+" "+d.cfg.PlanPath)
		if err == nil {
			d.mu.Lock()
			d.waiting = ""
			d.mu.Unlock()
			return lock, nil
		}
		var le *state.LockedError
		if !errors.As(err, &le) {
			d.log.Error("cannot take the state lock; retrying", "error", err)
		}
		d.mu.Lock()
		first := d.waiting == ""
		d.waiting = err.Error()
		d.mu.Unlock()
		if first {
			d.log.Warn("waiting for the state lock", "error", err)
			d.notify.status("waiting: " + err.Error())
		}
		if d.cfg.LockTimeout > 0 && time.Since(began) > d.cfg.LockTimeout {
			return nil, fmt.Errorf("%w (waited --lock-timeout %s)", err, d.cfg.LockTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// DaemonCommand starts the lock holder's description of a running loop: other commands
// recognise the daemon by it.
const DaemonCommand = "agent run"

// install takes a loaded plan; when valid it builds the loop's engine for it and queues
// every resource. A changed plan lifts every hold (backoff, terminal errors wait for
// exactly this); the same plan keeps the engine and the holds.
func (d *Daemon) install(p *plans.Plan, diags hcl.Diagnostics) error {
	d.noteInputs(p, !diags.HasErrors())
	if diags.HasErrors() {
		return d.rejected(fmt.Errorf("plan %s: %s", d.cfg.PlanPath, plans.DiagnosticsLine(diags)))
	}
	h := planHash(p)
	d.mu.Lock()
	same := d.eng != nil && h == d.planHash
	d.mu.Unlock()
	if same {
		d.mu.Lock()
		d.lastErr = ""
		d.mu.Unlock()
		d.metrics.planValid.Set(1)
		return nil
	}
	dir := d.cfg.StateDir
	if dir == "" {
		dir = p.Agent.StateDir
	}
	store, err := state.Open(dir)
	if err != nil {
		return d.rejected(err)
	}
	d.mu.Lock()
	old := d.store
	d.mu.Unlock()
	if old != nil && old.Dir() != store.Dir() {
		return d.rejected(fmt.Errorf("plan %s: agent.state_dir changed from %s to %s: the loop holds the old one's lock; restart the agent (systemctl restart agent) to move it", d.cfg.PlanPath, old.Dir(), store.Dir()))
	}
	// What loads may still not run (a --target that is gone, the host guard): such a
	// plan must not replace the last good one either.
	opts := d.engineOptions()
	opts.Rollouts = d.rolloutsFor(store)
	drained := drain.Hold(store.Dir()) // agent drain: the servers stay down until --undo
	opts.Hold = func(addr string) error {
		if err := d.hold(addr); err != nil {
			return err
		}
		return drained(addr)
	}
	eng, err := agent.New(p, d.cfg.Kinds, store, opts)
	if err != nil {
		return d.rejected(fmt.Errorf("plan %s: %w", d.cfg.PlanPath, err))
	}
	d.mu.Lock()
	running := d.running
	d.mu.Unlock()
	if running { // the lock is held: the plan's moved blocks are carried out now
		if err := eng.Prepare(context.Background()); err != nil {
			return d.rejected(fmt.Errorf("plan %s: %w", d.cfg.PlanPath, err))
		}
	}
	sh := newShape(eng)
	d.warnCoordination(p)
	d.mu.Lock()
	d.plan, d.planHash, d.store, d.lastErr, d.eng = p, h, store, "", eng
	d.engGen++
	d.shape = sh
	d.reloaded = time.Now()
	d.redact.SetRedactor(view.NewRedactor(p.Secrets()))
	for addr, rs := range d.res {
		rs.stopWatch()
		if !eng.Has(addr) {
			delete(d.res, addr)
			d.queue.Forget(addr)
			continue
		}
		rs.failures, rs.until, rs.terminal, rs.holdSeen = 0, time.Time{}, false, ""
	}
	d.mu.Unlock()
	d.metrics.planValid.Set(1)
	d.republish() // another engine: every resource's standing and series anew
	if running {
		for _, a := range sh.addrs {
			d.queue.Add(a)
		}
	}
	return nil
}

// rejected records a plan that cannot replace the last good one.
func (d *Daemon) rejected(err error) error {
	d.mu.Lock()
	d.lastErr = err.Error()
	d.mu.Unlock()
	d.metrics.planValid.Set(0)
	return err
}

// planHash identifies a plan's sources, in a stable order (a map's is not): a reload
// with the same files must keep backoff and terminal holds.
func planHash(p *plans.Plan) [32]byte {
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(p.Files)) {
		f := p.Files[name]
		fmt.Fprintf(h, "%s\x00%d\x00", name, len(f.Bytes))
		h.Write(f.Bytes)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// stuck reports whether a step in flight has run past its own timeout plus the grace
// (what and for how long). A 52 GB download or a driver install runs under its own long
// timeout and is working however long it takes within it; a hung readiness probe under
// a 2-minute timeout is stuck after 2 minutes and the grace, whatever else runs.
func (d *Daemon) stuck(now time.Time) (bool, string) {
	grace := orDefault(d.cfg.StuckGrace, DefaultStuckGrace)
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, addr := range slices.Sorted(maps.Keys(d.res)) {
		rs := d.res[addr]
		if !rs.inFlight || rs.phaseLimit <= 0 {
			continue
		}
		if over := now.Sub(rs.phaseStart.Add(rs.phaseLimit + grace)); over > 0 {
			return true, fmt.Sprintf("%s: %s has run %s, past its timeout %s and the grace %s",
				addr, rs.phase, now.Sub(rs.phaseStart).Round(time.Second), rs.phaseLimit, grace)
		}
	}
	return false, ""
}

// watchdog pings systemd while no step is stuck.
func (d *Daemon) watchdog(ctx context.Context) {
	every, err := watchdogInterval()
	if err != nil {
		d.log.Error("systemd's watchdog setting is malformed: no watchdog ping", "error", err)
	}
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if stuck, why := d.stuck(time.Now()); !stuck {
				d.notify.watchdog()
			} else {
				d.log.Error("stuck: no watchdog ping", "why", why)
			}
		}
	}
}

// report is the loop's latest observations as a status report, with each resource's
// recent failures and repair facts among its fields; nil before the plan is loaded.
func (d *Daemon) report() (*agent.Report, *plans.Plan) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.eng == nil {
		return nil, nil
	}
	rep := &agent.Report{}
	now := time.Now()
	for _, addr := range d.shape.addrs {
		rep.Steps = append(rep.Steps, d.stepFor(addr, now))
	}
	return rep, d.plan
}

// serve starts the loopback HTTP endpoint: /metrics, /status, /healthz.
func (d *Daemon) serve() (*http.Server, string, error) {
	listen := d.cfg.Listen
	if listen == "" {
		listen = d.plan.Agent.MetricsListen
	}
	if listen == "" {
		listen = DefaultListen
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, "", fmt.Errorf("metrics_listen %s: %w (another agent run? choose another address in the agent block)", listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.metrics.handler())
	mux.HandleFunc("GET /status", d.handleStatus)
	mux.HandleFunc("GET /healthz", d.handleHealth)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}
