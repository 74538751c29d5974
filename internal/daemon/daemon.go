// Package daemon is `agent run`: the reconcile loop that keeps a host converged, with
// systemd notification, per-resource backoff, and Prometheus metrics and live status on a
// loopback HTTP endpoint.
//
// The loop is level-based (controller-runtime's model): every pass compares the plan with
// the host afresh and never trusts a remembered event. A pass runs at start, every
// interval, when a plan file changes (debounced) and on SIGHUP. A plan that stops parsing
// is reported and the last good plan keeps running; nothing the old plan built is torn
// down. Each resource that fails waits an exponential backoff (capped, reset on success)
// before it is tried again, so one broken server neither blocks the others nor spins; a
// terminal error waits until the plan changes. Stopping the agent never stops what it
// manages.
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
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/sdnotify"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// Defaults of the agent block.
const (
	DefaultInterval = 30 * time.Second
	DefaultListen   = "127.0.0.1:9464"
	backoffMin      = 5 * time.Second
	backoffMax      = 10 * time.Minute
	debounce        = 500 * time.Millisecond
)

// Config is what Run needs. Load returns the plan bound to Kinds (diagnostics on error).
type Config struct {
	PlanPath string
	Load     func() (*plans.Plan, hcl.Diagnostics)
	Kinds    []agent.Kind
	// StateDir overrides the plan's agent.state_dir.
	StateDir string
	// Interval and Listen override the plan's agent block when set.
	Interval time.Duration
	Listen   string
	// Engine options for every pass (Parallelism, HostOverride, Log…); Hold is set by Run.
	Engine   agent.Options
	Log      *slog.Logger
	Notifier *sdnotify.Notifier
	// LockTimeout bounds the wait for an operator's plan/apply to finish before a pass is
	// skipped (default: the interval).
	LockTimeout time.Duration
	// Ready, when not nil, receives the listen address once the HTTP endpoint is up.
	Ready func(addr string)
	// StopGrace bounds how long the step in flight may run after SIGTERM (default 90 s,
	// under the unit's TimeoutStopSec): no new step starts, the current one finishes.
	StopGrace time.Duration
}

// Daemon is a running reconcile loop.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	redact  *agent.RedactingHandler // d.log's, given each loaded plan's secrets
	notify  *sdnotify.Notifier
	metrics *metrics

	// stopping is set on SIGTERM: resources not yet started in the pass are held back.
	stopping atomic.Bool

	mu       sync.Mutex
	plan     *plans.Plan
	planHash [32]byte
	store    *state.Store
	backoff  map[string]*backoffState
	lastPass time.Time
	// passDeadline is when the pass in flight has run past its budget (zero between
	// passes): until then a long pass is working, not stuck.
	passDeadline time.Time
	passes       int
	lastErr      string // the last plan load error, reported while the old plan runs
}

type backoffState struct {
	failures int
	until    time.Time
	terminal bool
	lastErr  string
}

// Run runs the loop until ctx ends or SIGTERM/SIGINT arrives. It fails at once when the
// first plan is invalid (there is no last good plan to keep).
func Run(ctx context.Context, cfg Config) error {
	d := &Daemon{cfg: cfg, log: cfg.Log, notify: cfg.Notifier, backoff: map[string]*backoffState{}, metrics: newMetrics()}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	// Everything the daemon and the resources log goes through the plan's redactor,
	// renewed on each reload: an error may quote a secret, and the log is the journal.
	d.redact = agent.NewRedactingHandler(d.log.Handler(), nil)
	d.log = slog.New(d.redact)
	if d.notify == nil {
		d.notify = sdnotify.FromEnv()
	}
	if err := d.reload(); err != nil {
		return err
	}

	sigCtx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Work runs under its own context: a signal stops new steps at once (stopping), and
	// cancels the step in flight only after the grace period.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	grace := cfg.StopGrace
	if grace <= 0 {
		grace = 90 * time.Second
	}
	go func() {
		<-sigCtx.Done()
		d.stopping.Store(true)
		select {
		case <-time.After(grace):
			d.log.Warn("the step in flight did not finish within the stop grace period; interrupting it", "grace", grace.String())
			cancelWork()
		case <-work.Done():
		}
	}()
	ctx = sigCtx
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	srv, addr, err := d.serve()
	if err != nil {
		return err
	}
	defer srv.Close()
	if cfg.Ready != nil {
		cfg.Ready(addr)
	}
	changed, closeWatch := d.watch(ctx)
	defer closeWatch()
	go d.watchdog(ctx)

	// READY before the first pass: the service is up (the endpoint serves, the loop
	// runs), and a first pass may take as long as a 52 GB download, far past systemd's
	// start timeout. STATUS= says when each pass is done.
	d.notify.Ready("first pass running")
	d.pass(work)
	d.notify.Ready(d.summary())
	for {
		timer := time.NewTimer(d.interval())
		reload := false
		select {
		case <-ctx.Done():
			timer.Stop()
			d.notify.Stopping()
			d.log.Info("stopping; managed servers keep running")
			return nil
		case <-timer.C:
		case <-hup:
			reload = true
			d.log.Info("SIGHUP: reloading the plan")
		case <-changed:
			reload = true
			d.log.Info("plan file changed: reloading")
		}
		timer.Stop()
		if reload {
			d.notify.Reloading()
			if err := d.reload(); err != nil {
				d.log.Error("the new plan is invalid; the last good plan keeps running", "error", err)
			}
		}
		if ctx.Err() != nil {
			continue // stopping: the top of the loop says goodbye
		}
		d.pass(work)
		d.notify.Ready(d.summary())
	}
}

// reload loads the plan; on success it replaces the current one and, when it changed,
// clears the backoff (a terminal error waits for exactly this).
func (d *Daemon) reload() error {
	p, diags := d.cfg.Load()
	if diags.HasErrors() {
		msg := diags.Error()
		d.mu.Lock()
		d.lastErr = msg
		d.mu.Unlock()
		d.metrics.planValid.Set(0)
		return fmt.Errorf("plan %s: %s", d.cfg.PlanPath, msg)
	}
	h := planHash(p)
	dir := d.cfg.StateDir
	if dir == "" {
		dir = p.Agent.StateDir
	}
	store, err := state.Open(dir)
	if err != nil {
		return err
	}
	// What loads may still not run (a --target that is gone, the host guard): such a
	// plan must not replace the last good one either.
	if _, err := agent.New(p, d.cfg.Kinds, store, d.engineOptions()); err != nil {
		d.mu.Lock()
		d.lastErr = err.Error()
		d.mu.Unlock()
		d.metrics.planValid.Set(0)
		return fmt.Errorf("plan %s: %w", d.cfg.PlanPath, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if h != d.planHash {
		d.backoff = map[string]*backoffState{}
	}
	d.plan, d.planHash, d.store, d.lastErr = p, h, store, ""
	d.redact.SetRedactor(agent.NewRedactor(p.Secrets()))
	d.metrics.planValid.Set(1)
	return nil
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

func (d *Daemon) interval() time.Duration {
	if d.cfg.Interval > 0 {
		return d.cfg.Interval
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.plan.Agent.Interval > 0 {
		return d.plan.Agent.Interval
	}
	return DefaultInterval
}

// ErrBackoff is the error of a resource held back after failures.
var ErrBackoff = errors.New("waiting before the next try")

// ErrStopping is the error of a resource not started because the agent is stopping.
var ErrStopping = errors.New("not started: the agent is stopping")

// ErrTerminalHold is the error of a resource whose last error retrying cannot fix: it
// waits for a plan change.
var ErrTerminalHold = errors.New("not retried until the plan changes")

// held reports an error of a resource the daemon did not touch this pass: nothing was
// tried, so nothing failed (metrics and backoff learn nothing from it).
func held(err error) bool {
	return errors.Is(err, ErrBackoff) || errors.Is(err, ErrStopping) || errors.Is(err, ErrTerminalHold)
}

// hold is the engine's Hold: a resource in backoff is not touched this pass.
func (d *Daemon) hold(addr string) error {
	if d.stopping.Load() {
		return fmt.Errorf("%s: %w", addr, ErrStopping)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.backoff[addr]
	if b == nil {
		return nil
	}
	if b.terminal {
		return fmt.Errorf("%s: %w (terminal error: %s)", addr, ErrTerminalHold, b.lastErr)
	}
	if time.Now().Before(b.until) {
		return fmt.Errorf("%s: %w (%d failures, next try in %s): last error: %s", addr, ErrBackoff, b.failures, time.Until(b.until).Round(time.Second), b.lastErr)
	}
	return nil
}

// engineOptions are the engine's options for every pass: the configured ones, with the
// daemon's log and hold.
func (d *Daemon) engineOptions() agent.Options {
	opts := d.cfg.Engine
	opts.Log = d.log
	opts.Hold = d.hold
	return opts
}

// pass is one reconcile pass under the state lock.
func (d *Daemon) pass(ctx context.Context) {
	d.mu.Lock()
	p, store := d.plan, d.store
	d.mu.Unlock()
	start := time.Now()
	lockWait := d.cfg.LockTimeout
	if lockWait <= 0 {
		lockWait = d.interval()
	}
	lock, err := store.Acquire(ctx, lockWait, "agent run "+d.cfg.PlanPath)
	if err != nil {
		d.log.Warn("pass skipped", "error", err)
		return
	}
	defer lock.Release()
	eng, err := agent.New(p, d.cfg.Kinds, store, d.engineOptions())
	if err != nil {
		d.log.Error("pass failed", "error", err)
		d.metrics.failures.WithLabelValues("").Inc()
		return
	}
	d.mu.Lock()
	d.passDeadline = time.Now().Add(eng.Budget())
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.passDeadline = time.Time{}
		d.mu.Unlock()
	}()
	rep := eng.Apply(ctx, nil)
	elapsed := time.Since(start)
	d.record(rep)
	d.metrics.observePass(rep, elapsed)
	if ctx.Err() == nil {
		d.metrics.setStatus(eng.Status(ctx), p)
	}
	d.mu.Lock()
	d.lastPass = time.Now()
	d.passes++
	d.mu.Unlock()
}

// record updates each resource's backoff from a pass's report.
func (d *Daemon) record(rep *agent.Report) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, st := range rep.Steps {
		switch {
		case st.Err == nil:
			delete(d.backoff, st.Addr)
			if st.Applied {
				d.log.Info("converged", "resource", st.Addr, "action", string(st.Diff.Action))
			}
		case held(st.Err):
			// Held back this pass: nothing new learned.
		default:
			if _, skipped := st.Skipped(); skipped {
				continue
			}
			b := d.backoff[st.Addr]
			if b == nil {
				b = &backoffState{}
				d.backoff[st.Addr] = b
			}
			if b.terminal {
				continue
			}
			b.failures++
			b.lastErr = st.Err.Error()
			b.terminal = agent.IsTerminal(st.Err)
			wait := backoffMin << min(b.failures-1, 16)
			b.until = time.Now().Add(min(wait, backoffMax))
			d.log.Error("resource failed", "resource", st.Addr, "error", st.Err, "failures", b.failures, "retry_in", min(wait, backoffMax).String(), "terminal", b.terminal)
		}
	}
}

// summary is the one-line STATUS= for systemctl status.
func (d *Daemon) summary() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	failing := 0
	for _, b := range d.backoff {
		if b != nil {
			failing++
		}
	}
	s := fmt.Sprintf("%d resources, %d failing, pass %d at %s", len(d.plan.Resources), failing, d.passes, d.lastPass.Format(time.TimeOnly))
	if d.lastErr != "" {
		s += "; new plan invalid, running the last good one"
	}
	return s
}

// watch reports (debounced) changes of the plan's files.
func (d *Daemon) watch(ctx context.Context) (<-chan struct{}, func()) {
	out := make(chan struct{}, 1)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		d.log.Warn("cannot watch the plan; reload with SIGHUP", "error", err)
		return out, func() {}
	}
	dir := d.cfg.PlanPath
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		dir = filepath.Dir(dir)
	}
	// Watch the directory: editors replace files by rename, which a file watch loses.
	if err := w.Add(dir); err != nil {
		d.log.Warn("cannot watch the plan; reload with SIGHUP", "error", err)
	}
	go func() {
		var fire <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if filepath.Ext(ev.Name) == ".hcl" {
					fire = time.After(debounce)
				}
			case <-w.Errors:
			case <-fire:
				fire = nil
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, func() { w.Close() }
}

// stuck reports whether the loop stopped making progress, and for how long. A pass in
// flight is stuck only once it has run past its budget (agent.Engine.Budget: a 52 GB
// download or a driver install is working, however long it takes within its timeouts)
// plus two intervals; between passes, when none has finished for three steps' default
// time plus three intervals (the next pass may wait an interval, and a lock).
func (d *Daemon) stuck(now time.Time) (bool, time.Duration) {
	d.mu.Lock()
	last, deadline := d.lastPass, d.passDeadline
	d.mu.Unlock()
	if !deadline.IsZero() {
		over := now.Sub(deadline.Add(2 * d.interval()))
		return over > 0, over
	}
	if last.IsZero() {
		return false, 0 // starting
	}
	idle := now.Sub(last)
	return idle > 3*agent.DefaultStepTimeout+3*d.interval(), idle
}

// watchdog pings systemd while the loop is not stuck.
func (d *Daemon) watchdog(ctx context.Context) {
	every := sdnotify.WatchdogInterval()
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
			if stuck, _ := d.stuck(time.Now()); !stuck {
				d.notify.Watchdog()
			}
		}
	}
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
