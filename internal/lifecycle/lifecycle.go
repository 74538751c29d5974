package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
)

// Lifecycle launches, probes and stops servers in a Place.
type Lifecycle struct {
	Place Place
	// GPU, when not nil, is asked after every stop whether the stopped PIDs still hold
	// GPU memory (gpu.WaitReleased; a no-op without GPUs).
	GPU gpu.Observer
	// HTTP is the client for readiness and smoke requests (a default one when nil).
	HTTP *http.Client
	// Poll is the interval of the launch's waits (DefaultPoll when zero).
	Poll time.Duration
}

// DefaultPoll is how often a launch looks at its process, log and endpoint.
const DefaultPoll = 100 * time.Millisecond

// TailLines is how many lines of a generation's log a launch error quotes.
const TailLines = 20

func (l *Lifecycle) poll() time.Duration {
	if l.Poll > 0 {
		return l.Poll
	}
	return DefaultPoll
}

func (l *Lifecycle) client() *http.Client {
	if l.HTTP != nil {
		return l.HTTP
	}
	return &http.Client{}
}

// Ready is how a server shows it is ready; each set part must hold.
type Ready struct {
	// HTTP is a path that must answer 200 ("/health").
	HTTP string
	// LogLine must appear in this generation's log.
	LogLine string
	// Timeout bounds a launch's wait for readiness, counted from the launch.
	Timeout time.Duration
	// Settle is how long the server must then stay alive and ready before its launch
	// counts as verified (0: no settle period).
	Settle time.Duration
}

// LaunchOptions say what to launch and how to verify it.
type LaunchOptions struct {
	// Name is the server's name: the stem of its log files.
	Name   string
	LogDir string
	// KeepLogs is how many generations' logs to keep, this one included.
	KeepLogs int
	// Generation is the generation to launch (NextGeneration).
	Generation int
	Spec       Spec
	Port       int
	Ready      Ready
	// Smoke, when not nil, runs once the server is ready.
	Smoke *Smoke
	// OnStarted is called as soon as the process exists, before any wait, so the
	// caller can record it: an agent killed during the wait still knows what it started.
	OnStarted func(*Launched) error
}

// Launched is one launch generation's process.
type Launched struct {
	Started
	Generation int
	LogPath    string
	LaunchedAt time.Time
	// ReadyAt is when readiness passed (zero when it did not).
	ReadyAt time.Time
	// VerifiedAt is when the whole verification passed: ready, settled, smoke test.
	VerifiedAt time.Time
	// Smoke is the smoke test's verdict (nil when there was none).
	Smoke *SmokeResult
}

// Target is what stops this launch: its group, its session and its marker.
func (x *Launched) Target(marker string) proc.Target {
	return proc.Target{Leader: x.ID, PGID: x.PGID, SID: x.SID, Marker: marker}
}

// LaunchError is a launch that did not come up: the process exited or readiness
// timed out. It quotes that generation's own log.
type LaunchError struct {
	Generation int
	LogPath    string
	// Place is where the log is when not on the host ("container sglang").
	Place string
	// Reason is what went wrong: "process exited (exit status 1) 0.4 s after start".
	Reason  string
	Failure *engines.Failure
	Tail    []string
	// Stopped says what became of the leftovers (the launch is stopped, verified).
	Stopped string
	// Exited says the launch's leader had exited by itself before the agent stopped
	// anything (it died: an OOM), as opposed to a launch the agent stopped (not ready by
	// ready.timeout, not ready at the end of its settle period).
	Exited bool
}

// ErrLaunch is wrapped by every *LaunchError.
var ErrLaunch = errors.New("launch failed")

func (e *LaunchError) Unwrap() error { return ErrLaunch }

func (e *LaunchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "launch of generation %d failed: %s", e.Generation, e.Reason)
	if e.Failure != nil {
		fmt.Fprintf(&b, "; %s", e.Failure)
	}
	if e.Stopped != "" {
		fmt.Fprintf(&b, "; %s", e.Stopped)
	}
	where := e.LogPath
	if e.Place != "" {
		where += " (in " + e.Place + ")"
	}
	if len(e.Tail) == 0 {
		fmt.Fprintf(&b, "; its log %s has no line from this generation", where)
		return b.String()
	}
	fmt.Fprintf(&b, "; last %d lines of its log %s (generation %d):", len(e.Tail), where, e.Generation)
	for _, line := range e.Tail {
		b.WriteString("\n    ")
		b.WriteString(clip(line, 400))
	}
	return b.String()
}

// Launch starts a new generation and verifies it: alive, its log grown, ready before
// o.Ready.Timeout, then the smoke test. A process that exits or is not ready in time
// is stopped (verified) and reported with its log as a *LaunchError; a failed smoke
// test is a *SmokeError and the server keeps running. The returned Launched is not
// nil whenever the process was started.
func (l *Lifecycle) Launch(ctx context.Context, o LaunchOptions) (*Launched, error) {
	log := LogFile{Dir: o.LogDir, Name: o.Name, Generation: o.Generation, Keep: o.KeepLogs}
	start := time.Now()
	st, err := l.Place.Start(ctx, o.Spec, log)
	if st == nil {
		return nil, err
	}
	x := &Launched{Started: *st, Generation: o.Generation, LogPath: log.Path(), LaunchedAt: start}
	if o.OnStarted != nil {
		if oerr := o.OnStarted(x); oerr != nil {
			// Unrecorded, the process would run with nobody to answer for it: stop it,
			// verified, before reporting. Its own context: the caller's may be spent.
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, serr := l.StopIn(sctx, x.NS, x.Target(o.Spec.Marker), syscall.SIGKILL, 5*time.Second, o.Port); serr != nil {
				oerr = fmt.Errorf("%w; stopping the unrecorded process failed too: %w", oerr, serr)
			} else {
				oerr = fmt.Errorf("%w; the process could not be recorded, so it was stopped, verified gone", oerr)
			}
			return x, errors.Join(err, oerr)
		}
	}
	if err != nil {
		return x, err
	}
	return x, l.Verify(ctx, x, o)
}

// Verify verifies a launch: ready before o.Ready.Timeout after x.LaunchedAt, then
// alive and ready for o.Ready.Settle, then the smoke test. Launch calls it right after
// the start; the server resource calls it for a launch an earlier agent recorded but
// never saw verified (it was killed during the wait). A process that exits, is not
// ready in time or does not settle is stopped (verified) and reported with its log as a
// *LaunchError; a failed smoke test is a *SmokeError and the server keeps running.
// x.ReadyAt and x.VerifiedAt say how far it got.
func (l *Lifecycle) Verify(ctx context.Context, x *Launched, o LaunchOptions) error {
	if reason := l.waitReady(ctx, x, o); reason != "" {
		if ctx.Err() != nil {
			// The agent is being stopped or the step ran out of time: leave the
			// process alone (it is recorded), the next run judges it afresh.
			return fmt.Errorf("launch of generation %d: %s: %w", o.Generation, reason, ctx.Err())
		}
		return l.failed(x, o, reason)
	}
	x.ReadyAt = time.Now()
	if reason := l.settle(ctx, x, o); reason != "" {
		if ctx.Err() != nil {
			return fmt.Errorf("launch of generation %d: %s: %w", o.Generation, reason, ctx.Err())
		}
		return l.failed(x, o, reason)
	}
	if o.Smoke != nil {
		r, err := RunSmoke(ctx, l.client(), l.Place.Endpoint(o.Port), *o.Smoke)
		if err != nil {
			return fmt.Errorf("generation %d is ready but its smoke test got no answer: %w (the server was left running)", o.Generation, err)
		}
		x.Smoke = &r
		if !r.OK {
			return &SmokeError{Generation: o.Generation, Result: r}
		}
	}
	x.VerifiedAt = time.Now()
	return nil
}

// HostPath is where the agent reads path, a file of its place; path itself
// when it cannot be mapped (the read then fails with a clear error).
func (l *Lifecycle) HostPath(ctx context.Context, path string) string {
	if p, err := l.Place.HostPath(ctx, path); err == nil {
		return p
	}
	return path
}

func linkCheck(dir, name string) error {
	link := CurrentLink(dir, name)
	if st, err := os.Lstat(link); err == nil && st.Mode().Type()&os.ModeSymlink == 0 {
		return fmt.Errorf("%s exists and is not a symlink: move it aside (the agent keeps <name>.log as a link to the current generation's log)", link)
	}
	return nil
}

// waitReady waits for the launch to be ready; it returns "" when it is, else why not.
func (l *Lifecycle) waitReady(ctx context.Context, x *Launched, o LaunchOptions) string {
	// Counted from the launch: a launch verified by a later agent has only what is left.
	deadline := time.NewTimer(max(time.Until(x.LaunchedAt.Add(o.Ready.Timeout)), time.Millisecond))
	defer deadline.Stop()
	tick := time.NewTicker(l.poll())
	defer tick.Stop()
	watch := &lineWatch{want: o.Ready.LogLine}
	procs := l.ProcsIn(ctx, x.NS)
	var grown, httpOK, lineOK bool
	for {
		// Mapped at each look: in a container reached only through Incus, the path is
		// a copy of the log as it is now (Incus.HostPath).
		logPath := l.HostPath(ctx, x.LogPath)
		watch.path = logPath
		select {
		case <-x.Exited:
			return l.exitReason(x)
		default:
		}
		if alive, err := procs.Alive(ctx, x.ID); err == nil && !alive {
			if x.Exited != nil {
				// Our own child: let the reaper record how it ended.
				select {
				case <-x.Exited:
				case <-time.After(time.Second):
				}
			}
			return l.exitReason(x)
		}
		if !grown {
			if fi, err := os.Stat(logPath); err == nil && fi.Size() > 0 {
				grown = true
			}
		}
		if !lineOK {
			lineOK, _ = watch.seen()
		}
		if !httpOK {
			httpOK = o.Ready.HTTP == "" || l.probeHTTP(ctx, o.Port, o.Ready.HTTP, 2*time.Second) == nil
		}
		if grown && httpOK && lineOK {
			return ""
		}
		select {
		case <-ctx.Done():
			return "interrupted while waiting for readiness"
		case <-deadline.C:
			var missing []string
			if !grown {
				missing = append(missing, "its log has no line from this generation")
			}
			if !httpOK {
				missing = append(missing, fmt.Sprintf("GET %s never answered 200", o.Ready.HTTP))
			}
			if !lineOK {
				missing = append(missing, fmt.Sprintf("%q never appeared in its log", o.Ready.LogLine))
			}
			return fmt.Sprintf("not ready %s after start (ready.timeout): %s", o.Ready.Timeout, strings.Join(missing, ", "))
		case <-x.Exited:
			return l.exitReason(x)
		case <-tick.C:
		}
	}
}

// exited reports whether x's leader is gone already: it exited by itself (the reaper
// saw it, or /proc no longer has it).
func (l *Lifecycle) exited(ctx context.Context, x *Launched) bool {
	if x.Exited != nil {
		select {
		case <-x.Exited:
			return true
		default:
		}
	}
	alive, err := l.ProcsIn(ctx, x.NS).Alive(ctx, x.ID)
	return err == nil && !alive
}

func (l *Lifecycle) exitReason(x *Launched) string {
	how := "exited"
	if x.ExitStatus != nil {
		if s := x.ExitStatus(); s != "" {
			how = "exited (" + s + ")"
		}
	}
	return fmt.Sprintf("process %d %s %.1f s after start", x.ID.PID, how, time.Since(x.LaunchedAt).Seconds())
}

// failed stops what is left of a failed launch and builds its error from its log.
func (l *Lifecycle) failed(x *Launched, o LaunchOptions, reason string) error {
	e := &LaunchError{Generation: x.Generation, LogPath: x.LogPath, Reason: reason}
	if place := l.Place.Name(); place != (Local{}).Name() {
		e.Place = place
	}
	// Stop leftovers (children, a half-started server) so the next launch starts clean
	// and nothing holds the port or GPU memory. Its own context: the caller's may be
	// nearly spent by the readiness wait.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.Exited = l.exited(ctx, x)
	rep, err := l.StopIn(ctx, x.NS, x.Target(o.Spec.Marker), syscall.SIGTERM, 5*time.Second, o.Port)
	switch {
	case err != nil:
		e.Stopped = "stopping its leftovers failed: " + err.Error()
	case len(rep.Targets) > 0:
		e.Stopped = fmt.Sprintf("its %d leftover processes were stopped, verified gone", len(rep.Targets))
	}
	if r, ok := l.Place.(*Incus); ok {
		r.forgetCopy(x.LogPath) // the last lines, written as it died, not a copy of before
	}
	logPath := l.HostPath(ctx, x.LogPath)
	if tail, err := Excerpt(logPath, TailLines); err == nil {
		e.Tail = tail
	}
	if f, ok := Failure(logPath); ok {
		e.Failure = &f
	}
	return e
}

// ProbeHTTP GETs path on the server's port and returns nil on 200.
func (l *Lifecycle) ProbeHTTP(ctx context.Context, port int, path string) error {
	return l.probeHTTP(ctx, port, path, 3*time.Second)
}

func (l *Lifecycle) probeHTTP(ctx context.Context, port int, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.Place.Endpoint(port)+path, nil)
	if err != nil {
		return err
	}
	resp, err := l.client().Do(req)
	if err != nil {
		return err
	}
	drain(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &statusError{path: path, code: resp.StatusCode}
	}
	return nil
}

// Metrics scrapes the server's /metrics (SGLang's --enable-metrics).
func (l *Lifecycle) Metrics(ctx context.Context, port int) (engines.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.Place.Endpoint(port)+"/metrics", nil)
	if err != nil {
		return engines.Metrics{}, err
	}
	resp, err := l.client().Do(req)
	if err != nil {
		return engines.Metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engines.Metrics{}, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return engines.Metrics{}, err
	}
	return engines.ParsePrometheus(string(b))
}

// PortWait bounds the wait for the port to be free after a verified stop.
const PortWait = 10 * time.Second

// GPUWait bounds the wait for GPU memory to be released after a verified stop.
const GPUWait = 30 * time.Second

// ErrStop is wrapped by every failed verified stop.
var ErrStop = errors.New("stop not verified")

// Stop stops t and proves it: every process of the target gone (proc.Stop: sig to the
// group, escalation to SIGKILL, PID and start time checked), then port free (when
// port > 0), then none of the stopped PIDs holding GPU memory.
func (l *Lifecycle) Stop(ctx context.Context, t proc.Target, sig syscall.Signal, timeout time.Duration, port int) (proc.Report, error) {
	return l.stop(ctx, l.Place.Procs(ctx), false, t, sig, timeout, port)
}

// StopIn is Stop of a target whose PIDs belong to the PID namespace ns (Started.NS): a
// recorded launch, stopped in the namespace it was recorded in. Processes of another
// namespace than this host's have no systemd unit here and their GPU memory is not
// this host's to observe: the proof there is the processes gone and the port free.
func (l *Lifecycle) StopIn(ctx context.Context, ns string, t proc.Target, sig syscall.Signal, timeout time.Duration, port int) (proc.Report, error) {
	return l.stop(ctx, l.ProcsIn(ctx, ns), ns != "", t, sig, timeout, port)
}

// ProcsIn observes and stops processes whose PIDs belong to the PID namespace ns: the
// place's own processes for "" (this host's), unless the place tells namespaces
// apart (Incus.ProcsIn).
func (l *Lifecycle) ProcsIn(ctx context.Context, ns string) Procs {
	if r, ok := l.Place.(interface {
		ProcsIn(context.Context, string) Procs
	}); ok {
		return r.ProcsIn(ctx, ns)
	}
	return l.Place.Procs(ctx)
}

func (l *Lifecycle) stop(ctx context.Context, procs Procs, foreign bool, t proc.Target, sig syscall.Signal, timeout time.Duration, port int) (proc.Report, error) {
	if _, remote := procs.(remoteProcs); remote {
		foreign = true // the instance's own PIDs, whichever namespace it has now
	}
	unit := ""
	if !foreign {
		unit = unitOfTarget(ctx, procs, t) // systemd_unit.go
	}
	rep, err := procs.Stop(ctx, t, sig, timeout)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrStop, err)
	}
	if unit != "" {
		if err := finishUnit(ctx, unit); err != nil {
			return rep, fmt.Errorf("%w: %w", ErrStop, err)
		}
	}
	if port > 0 {
		if err := procs.PortFree(ctx, port, PortWait); err != nil {
			return rep, fmt.Errorf("%w: %d processes stopped, but %w", ErrStop, len(rep.Targets), err)
		}
	}
	if l.GPU != nil && len(rep.Targets) > 0 && !foreign {
		pids := make([]int, len(rep.Targets))
		for i, id := range rep.Targets {
			pids[i] = id.PID
		}
		if err := gpu.WaitReleased(ctx, l.GPU, pids, time.Now().Add(GPUWait), 0); err != nil {
			return rep, fmt.Errorf("%w: %d processes stopped, but %w", ErrStop, len(rep.Targets), err)
		}
	}
	return rep, nil
}

// Summary describes a stop report in one phrase for logs and messages.
func Summary(rep proc.Report) string {
	switch {
	case len(rep.Targets) == 0:
		return "nothing was left to stop"
	case len(rep.Killed) > 0:
		return fmt.Sprintf("%d processes stopped (%d needed SIGKILL), verified gone in %s", len(rep.Targets), len(rep.Killed), rep.Elapsed.Round(time.Millisecond))
	}
	return fmt.Sprintf("%d processes stopped by %s, verified gone in %s", len(rep.Targets), rep.Signal, rep.Elapsed.Round(time.Millisecond))
}
