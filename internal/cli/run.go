package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/daemon"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/registry"
)

// runDaemon is `agent run PLAN`: the reconcile loop until SIGTERM.
func runDaemon(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flagSet("run", &o, stderr)
	interval := fs.Duration("interval", 0, "`DUR` between two full reconciles (default: the plan's agent.interval, else 30s)")
	listen := fs.String("listen", "", "`ADDR` of /status, /metrics and /healthz (default: the plan's agent.metrics_listen, else 127.0.0.1:9464)")
	fs.Lookup("log-level").DefValue = "info"
	o.logLevel = "info"
	pos, code, ok := parseArgs("run", fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "agent run: want exactly one PLAN")
		return exitUsage
	}
	log, err := newLogger(stderr, o.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "agent run: %v\n", err)
		return exitUsage
	}
	// The driver kind asks the fleet's host permit through the gate (agent { coordination }).
	m := resources.HostFromEnv(os.Getenv)
	gate := fleet.NewHostGate(m.BootID)
	m.HostDisruption = gate
	kinds := registry.KindsFor(m)
	err = daemon.Run(ctx, daemon.Config{
		HostGate: gate,
		BootID:   m.BootID,
		PlanPath: pos[0],
		Load: func() (*plans.Plan, hcl.Diagnostics) {
			return loadPlan(pos[0], o, kinds)
		},
		Kinds:       kinds,
		StateDir:    o.stateDir,
		Interval:    *interval,
		Listen:      *listen,
		LockTimeout: o.lockTimeout,
		Engine:      agent.Options{Parallelism: o.parallelism, HostOverride: o.hostOverride, NoDestructive: o.noDestructive, Targets: o.targets, Orphans: agent.OrphansByPlan, Loop: true},
		Log:         log,
		Version:     Version,
		StartAttrs:  []slog.Attr{slog.Bool("servers_in_systemd_units", lifecycle.ServersInUnits())},
	})
	if err != nil {
		fmt.Fprintf(stderr, "agent run: %v\n", err)
		return ExitError
	}
	return ExitOK
}

// statusFromDaemon asks a running `agent run` for status. It is used only when that daemon
// manages the same state directory; otherwise (or when none answers) status observes the
// host itself.
func statusFromDaemon(p *plans.Plan, stateDir string, asJSON bool, stdout io.Writer, red *view.Redactor) (int, bool) {
	addr := p.Agent.MetricsListen
	if addr == "" {
		addr = daemon.DefaultListen
	}
	return statusFromDaemonAt(addr, stateDir, asJSON, stdout, red)
}

// statusWithoutPlan is `agent status` when the plan does not load here (a var file gone,
// an edit with a typo): the daemon running on the state directory (--state-dir, else the
// default) still serves its last good plan, and its view is what the host does. The
// plan's errors go to stderr first; the daemon's /status says the plan is invalid too
// (ok false), so the exit code is at least degraded. ok is false when no daemon answers.
func statusWithoutPlan(stateDir string, p *plans.Plan, diags hcl.Diagnostics, asJSON bool, stdout, stderr io.Writer, red *view.Redactor) (int, bool) {
	if stateDir == "" {
		stateDir = state.DefaultDir
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return 0, false
	}
	ri, err := daemon.ReadRunFile(abs)
	if err != nil || ri.Listen == "" {
		return 0, false
	}
	var out bytes.Buffer
	code, ok := statusFromDaemonAt(ri.Listen, abs, asJSON, &out, red)
	if !ok {
		return 0, false
	}
	if !asJSON {
		var files map[string]*hcl.File
		if p != nil {
			files = p.Files
		}
		plans.WriteDiagnostics(stderr, files, diags)
		fmt.Fprintf(stderr, "\nThe plan does not load here; agent run (PID %d) runs its last good one. Its view:\n", ri.PID)
	}
	stdout.Write(out.Bytes())
	if code == ExitOK {
		code = ExitDegraded
	}
	return code, true
}

// statusFromDaemonAt asks the daemon answering at addr, when it manages stateDir.
func statusFromDaemonAt(addr, stateDir string, asJSON bool, stdout io.Writer, red *view.Redactor) (int, bool) {
	client := &http.Client{Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+addr+"/healthz", nil)
	resp, err := client.Do(req)
	if err != nil {
		return 0, false
	}
	resp.Body.Close()
	resp, err = client.Get("http://" + addr + "/status")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var doc view.JSONOutput
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&doc) != nil || doc.StateDir != stateDir {
		return 0, false
	}
	if asJSON {
		view.WriteJSON(stdout, &doc)
	} else {
		fmt.Fprintf(stdout, "(from agent run at %s)\n", addr)
		(&view.View{W: stdout, Redact: red}).Status(view.StatusReport(&doc))
	}
	for _, r := range doc.Resources {
		if r.Error != "" {
			return ExitError, true
		}
	}
	if !doc.OK {
		return ExitDegraded, true
	}
	return ExitOK, true
}
