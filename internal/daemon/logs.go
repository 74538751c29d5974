package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/view"
)

// The loop's log is its operator's first account of what it does (docs/service.md,
// "Logs"): a start line with what it runs on; each action with the changed attributes
// and their reasons (the engine's "applying" line); a line every few seconds while a
// server takes its time to stop; and, at --log-level debug, why each resource was looked
// at, what was seen, and what it waits for.

// DefaultStopProgress is how often a stop that waits for a server to exit is logged.
const DefaultStopProgress = proc.DefaultStopProgressEvery

// logStart is the first line of a running loop: what it is, what it runs, where it keeps
// its records and how it acts, so that a journal read weeks later says which agent did
// what.
func (d *Daemon) logStart(listen string) {
	d.mu.Lock()
	p, store, eng := d.plan, d.store, d.eng
	d.mu.Unlock()
	workers := d.cfg.Engine.Parallelism
	if workers < 1 {
		workers = agent.DefaultParallelism // as Run starts them
	}
	version := d.cfg.Version
	if version == "" {
		version = "dev"
	}
	attrs := []any{
		"version", version,
		"pid", os.Getpid(),
		"plan", d.cfg.PlanPath,
		"plan_files", strings.Join(slices.Sorted(maps.Keys(p.Files)), ","),
		"resources", len(eng.Addrs()),
		"state_dir", store.Dir(),
		"parallelism", workers,
		"interval", d.resyncInterval().String(),
		"listen", listen,
		"prune", p.Agent.Prune,
	}
	for _, a := range d.cfg.StartAttrs {
		attrs = append(attrs, a)
	}
	d.log.Info("agent run starting", attrs...)
}

// resyncInterval is the un-jittered resync period.
func (d *Daemon) resyncInterval() time.Duration {
	switch {
	case d.cfg.Interval > 0:
		return d.cfg.Interval
	case d.plan != nil && d.plan.Agent.Interval > 0:
		return d.plan.Agent.Interval
	}
	return DefaultInterval
}

// traceQueue is the work queue's debug line: why a resource is (or is not) looked at now.
func (d *Daemon) traceQueue(addr, what string, after time.Duration) {
	if after > 0 {
		d.log.Debug(what, "resource", addr, "in", after.Round(time.Millisecond).String())
		return
	}
	d.log.Debug(what, "resource", addr)
}

// withStopProgress makes a stop during addr's reconcile (a server that drains its
// requests after SIGTERM, or ignores it) log where it stands every few seconds, instead
// of a minute of silence before "stopped". internal/proc measures; the loop logs.
func (d *Daemon) withStopProgress(ctx context.Context, addr string) context.Context {
	every := orDefault(d.cfg.StopProgress, DefaultStopProgress)
	return proc.WithStopProgress(ctx, every, func(p proc.StopProgress) {
		d.log.Info(fmt.Sprintf("stopping %s: %s", addr, p),
			"resource", addr, "pid", p.Leader.PID, "signal", p.SignalName(),
			"waited", p.Waited.Round(time.Millisecond).String(), "wait", p.Wait.String(), "left", p.Left)
	})
}

// logProgress logs where long work stands (a 52 GB download) every ProgressEvery of its
// time, with its figures as attributes, and its closing line if it logged one: the
// journal is not an hour of silence, nor a line every 250 ms.
func (d *Daemon) logProgress(p agent.Progress) {
	d.mu.Lock()
	if rs := d.res[p.Addr]; rs != nil && rs.action != "" && !p.Final {
		rs.progress = &p // /status says where it stands (inflight.go)
	}
	d.mu.Unlock()
	line, ok := d.progress.Line(p)
	if !ok {
		return
	}
	attrs := []any{"resource", p.Addr, "done_bytes", p.Done}
	if !p.Final {
		eta := -1.0
		if p.ETA >= 0 && p.Total > 0 {
			eta = p.ETA.Round(time.Second).Seconds()
		}
		attrs = append(attrs, "total_bytes", p.Total, "rate_bytes_per_second", int64(p.Rate), "eta_seconds", eta)
	}
	attrs = append(attrs, "elapsed", p.Elapsed.Round(time.Second).String())
	d.log.Info(p.Addr+": "+line, attrs...)
}

// debugOn reports whether debug lines would be written (to skip building them).
func (d *Daemon) debugOn() bool { return d.log.Enabled(context.Background(), slog.LevelDebug) }

// verdict is what a reconcile saw and did, as debug attributes.
func verdict(st *agent.Step) []any {
	out := []any{"took", st.Duration.Round(time.Millisecond).String()}
	if st.Diff != nil {
		out = append(out, "observed", string(st.Diff.Action))
		if len(st.Diff.Changes) > 0 {
			out = append(out, "changes", view.LogChanges(st.Diff.Changes))
		}
	}
	out = append(out, "applied", st.Applied)
	if st.Err != nil {
		out = append(out, "error", st.Err)
	}
	return out
}
