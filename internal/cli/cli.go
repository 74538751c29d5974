// Package cli is the agent's command line: it parses flags, loads the plan, runs the
// engine and prints one of its two views (human or --json). Exit codes are part of the
// contract (SPEC.md): plan 0/2/1, apply 0/1, status 0/3/1, validate 0/1, fmt -check 0/3/1.
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"
	"golang.org/x/term"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/drain"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/savedplan"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/registry"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitError    = 1
	ExitChanges  = 2 // plan: the host differs from the plan
	ExitDegraded = 3 // status: something is degraded; fmt -check: a file would change
	exitUsage    = 64
)

// Version is set at build time with -ldflags "-X github.com/agent-dev/agent/internal/cli.Version=…".
var Version = "dev"

const usage = `agent: declarative provisioning for GPU inference hosts

Usage:
  agent validate PLAN     parse and type-check a plan (no host access)
  agent plan PLAN         show what apply would change (exit 0 none, 2 changes, 1 error)
  agent plan -out F PLAN  also save it to F, bound to what it observed (for apply F)
  agent apply PLAN        apply the plan in dependency order, verifying every step
  agent apply FILE        apply exactly a saved plan, if the host and plan still match it
  agent show FILE         print a saved plan as agent plan did (no host access)
  agent status PLAN       live state of every resource (exit 0 healthy, 3 degraded)
  agent destroy PLAN      stop and remove everything the plan manages, dependents first, verified
  agent run PLAN          the reconcile loop, as a systemd service (docs/service.md)
  agent fmt [-check] PLAN rewrite plan files in canonical form
  agent export            observe this host and print a plan that reproduces it (docs/export.md)
  agent drain PLAN        stop every server for hardware work, under a host permit; --undo relaunches
  agent fleet release HOST PLAN  free a host's host permit (a host that does not come back; docs/fleet.md)
  agent version           print the version
  agent help COMMAND      a command's flags and an example (as agent COMMAND --help)

PLAN is a *.hcl file or a directory of them. Flags may come before or after PLAN:
  --state-dir DIR      where state and the lock live (default: the plan's agent.state_dir, else /var/lib/agent)
  --json               machine-readable output (plan, apply, status, destroy, validate)
  -var NAME=VALUE      set a variable (repeatable); -var-file FILE (repeatable); AGENT_VAR_NAME in the environment
  --target ADDR        act on ADDR and what it depends on (repeatable)
  --parallelism N      resources observed or applied at once (default 4)
  --lock-timeout DUR   wait this long for another agent's lock (default 0: fail at once)
  --host-override NAME run a plan guarded for host NAME on this host (migrations)
  --no-destructive     refuse restarts, replacements and deletions (apply)
  --allow-delete-all   let an apply delete every server the agent manages when the plan keeps none
  --smoke              run each server's smoke test now (status; a real completion on the server)
  --fleet              every host of the fleet and its rollouts, from etcd (status; agent { coordination })
  --hosts ADDR,...     with --fleet: when etcd cannot be read, each agent's own /status at its metrics_listen
  --log-level LEVEL    debug, info, warn (default; info for run), error; logs go to stderr

Run 'agent COMMAND --help' for a command's flags and an example.
Docs: docs/plan-language.md, docs/architecture.md.
`

// Main runs the command line and returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cmd {
	case "validate", "plan", "apply", "status", "destroy", "drain":
		return run(ctx, cmd, rest, stdout, stderr)
	case "run":
		return runDaemon(ctx, rest, stdout, stderr)
	case "fmt":
		return runFmt(rest, stdout, stderr)
	case "show":
		return runShow(rest, stdout, stderr)
	case "export":
		return runExport(ctx, rest, stdout, stderr)
	case "fleet":
		return runFleet(ctx, rest, stdout, stderr)
	case "version", "--version", "-version":
		if len(rest) > 0 && (rest[0] == "--help" || rest[0] == "-h") {
			writeHelp(stdout, "version", nil)
			return ExitOK
		}
		fmt.Fprintf(stdout, "agent %s\n", Version)
		return ExitOK
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" {
			if _, ok := commands[rest[0]]; !ok {
				return unknownCommand(stderr, rest[0])
			}
			return Main([]string{rest[0], "--help"}, stdout, stderr) // `agent help apply`
		}
		fmt.Fprint(stdout, usage)
		return ExitOK
	}
	return unknownCommand(stderr, cmd)
}

// multi is a repeatable string flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

type options struct {
	stateDir      string
	json          bool
	vars          multi
	varFiles      multi
	targets       multi
	parallelism   int
	lockTimeout   time.Duration
	hostOverride  string
	noDestructive bool
	logLevel      string
	allowDelAll   bool
	smoke         bool
	fleet         bool
	hosts         string
	out           string
	reason        string // drain
	undo          bool   // drain --undo
}

// parseInterleaved parses flags that may come before or after positional arguments, as
// operators type them (`agent plan plan.hcl --json`).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// flagSet declares the flags every plan command shares.
func flagSet(cmd string, o *options, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("agent "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	// Each command declares the flags it uses, so that its --help lists exactly those.
	for _, f := range []struct {
		name  string
		cmds  string // the commands that take it
		apply func()
	}{
		{"state-dir", "plan apply status destroy run drain", func() {
			fs.StringVar(&o.stateDir, "state-dir", "", "`DIR`: where state and the lock live (default: the plan's agent.state_dir, else /var/lib/agent)")
		}},
		{"json", "validate plan apply status destroy", func() {
			fs.BoolVar(&o.json, "json", false, "one JSON document instead of text (docs/json-output.md)")
		}},
		{"var", "validate plan apply status destroy run drain", func() {
			fs.Var(&o.vars, "var", "`NAME=VALUE`: set a variable (repeatable; also AGENT_VAR_NAME in the environment)")
			fs.Var(&o.varFiles, "var-file", "`FILE`: read variables from an HCL file (repeatable)")
		}},
		{"target", "plan apply status destroy run", func() {
			fs.Var(&o.targets, "target", "`ADDR`: act on this resource and what it depends on (repeatable)")
		}},
		{"parallelism", "plan apply status destroy run", func() {
			fs.IntVar(&o.parallelism, "parallelism", agent.DefaultParallelism, "`N` resources observed or applied at once")
		}},
		{"lock-timeout", "plan apply destroy run drain", func() {
			fs.DurationVar(&o.lockTimeout, "lock-timeout", 0, "`DUR`: wait this long for another agent's lock (0: fail at once)")
		}},
		{"host-override", "plan apply status destroy run", func() {
			fs.StringVar(&o.hostOverride, "host-override", "", "`NAME`: run a plan guarded for host NAME on this host (migrations)")
		}},
		{"no-destructive", "plan apply run", func() {
			fs.BoolVar(&o.noDestructive, "no-destructive", false, "refuse restarts, replacements and deletions")
		}},
		{"allow-delete-all", "plan apply", func() {
			fs.BoolVar(&o.allowDelAll, "allow-delete-all", false, "let an apply delete every server the agent manages when the plan keeps none")
		}},
		{"log-level", "validate plan apply status destroy run drain", func() {
			fs.StringVar(&o.logLevel, "log-level", "warn", "`LEVEL`: debug, info, warn or error; logs go to stderr")
		}},
	} {
		if slices.Contains(strings.Fields(f.cmds), cmd) {
			f.apply()
		}
	}
	if cmd == "drain" {
		fs.StringVar(&o.reason, "reason", "", "`TEXT`: why (shown in agent status --fleet and kept in the drain record)")
		fs.BoolVar(&o.undo, "undo", false, "relaunch the servers, verified, and release the host permit once they serve")
	}
	if cmd == "plan" {
		fs.StringVar(&o.out, "out", "", "`FILE`: also save the plan, bound to what it observed, for agent apply FILE (0600)")
	}
	o.parallelism = max(o.parallelism, 1) // validate has no --parallelism
	if cmd == "status" {
		fs.BoolVar(&o.smoke, "smoke", false, "run each server's smoke test now (a real completion)")
		fs.BoolVar(&o.fleet, "fleet", false, "every host of the fleet, from etcd (agent { coordination })")
		fs.StringVar(&o.hosts, "hosts", "", "`ADDR,...`: with --fleet, when etcd cannot be read, ask each agent's own /status at these metrics_listen addresses")
	}
	return fs
}

func run(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flagSet(cmd, &o, stderr)
	pos, code, ok := parseArgs(cmd, fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "agent %s: want exactly one PLAN (a .hcl file or a directory), got %d arguments\n", cmd, len(pos))
		return exitUsage
	}
	if o.parallelism < 1 {
		fmt.Fprintf(stderr, "agent %s: --parallelism must be at least 1\n", cmd)
		return exitUsage
	}
	log, err := newLogger(stderr, o.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "agent %s: %v\n", cmd, err)
		return exitUsage
	}
	if o.out != "" {
		if err := savedplan.CanWrite(o.out); err != nil {
			fmt.Fprintf(stderr, "agent %s: %v\n", cmd, err)
			return exitUsage
		}
	}
	planPath := pos[0]
	var saved *savedplan.File
	if cmd == "apply" && savedplan.Sniff(planPath) {
		f, usage, err := openSaved(planPath, fs, &o)
		switch {
		case usage:
			fmt.Fprintf(stderr, "agent apply: %v\n", err)
			return exitUsage
		case err != nil && o.json:
			view.WriteJSON(stdout, view.ErrorJSON(cmd, err.Error()))
			return ExitError
		case err != nil:
			fmt.Fprintf(stderr, "agent apply: %v\n", err)
			return ExitError
		}
		saved, planPath = f, f.Source.Path
	}

	// The driver kind asks the fleet's host permit through the gate; only apply (applyFleet)
	// and drain (to record a failed step in the permit it took) attach it, so the other
	// commands ask nothing.
	m := resources.HostFromEnv(os.Getenv)
	gate := fleet.NewHostGate(m.BootID)
	m.HostDisruption = gate
	kinds := registry.KindsFor(m)
	p, diags := loadPlan(planPath, o, kinds)
	var secrets []string
	if p != nil {
		secrets = p.Secrets()
	}
	red := view.NewRedactor(secrets)
	log = slog.New(view.NewRedactingHandler(log.Handler(), red))
	human := &view.View{W: stdout, Redact: red}
	if diags.HasErrors() {
		if cmd == "status" && !o.smoke {
			if code, ok := statusWithoutPlan(o.stateDir, p, diags, o.json, stdout, stderr, red); ok {
				return code
			}
		}
		return invalid(cmd, p, diags, o.json, stdout, stderr)
	}
	if cmd == "validate" {
		if o.json {
			view.WriteJSON(stdout, view.DiagnosticsJSON(cmd, plans.DiagnosticsJSON(diags)))
		} else {
			if len(diags) > 0 {
				plans.WriteDiagnostics(stderr, p.Files, diags)
			}
			fmt.Fprintf(stdout, "The plan is valid: %d resources.\n", len(p.Resources))
		}
		return ExitOK
	}
	inv := &invocation{cmd: cmd, o: o, planArg: pos[0], p: p, kinds: kinds, saved: saved,
		red: red, log: log, human: human, stdout: stdout, stderr: stderr, gate: gate, bootID: m.BootID}
	return inv.execute(ctx)
}

// invocation is one plan, apply, destroy or status of a valid plan: what run gathered
// from the command line and the plan, for the engine's run.
type invocation struct {
	cmd     string
	o       options
	planArg string // the PLAN argument as given (a saved plan's file for apply FILE)
	p       *plans.Plan
	kinds   []agent.Kind
	saved   *savedplan.File // apply FILE: the saved plan
	red     *view.Redactor
	log     *slog.Logger
	human   *view.View
	stdout  io.Writer
	stderr  io.Writer

	store *state.Store
	key   []byte // the digests' key of a saved plan

	gate   *fleet.HostGate // the driver kind's host-permit hook
	bootID func() string
	fleet  *applyFleet // apply with agent { coordination }
}

// fail reports err, redacted, as the command's error.
func (inv *invocation) fail(err error) int {
	msg := inv.red.String(err.Error())
	if inv.o.json {
		view.WriteJSON(inv.stdout, view.ErrorJSON(inv.cmd, msg))
	} else {
		fmt.Fprintf(inv.stderr, "agent %s: %s\n", inv.cmd, msg)
	}
	return ExitError
}

// execute opens the state, builds the engine, takes the lock (but for status) and runs
// the command.
func (inv *invocation) execute(ctx context.Context) int {
	cmd, o, p := inv.cmd, inv.o, inv.p
	if cmd == "status" && o.fleet {
		return fleetStatus(ctx, p, o.json, splitList(o.hosts), inv.stdout, inv.stderr, inv.red)
	}
	dir := o.stateDir
	if dir == "" {
		dir = p.Agent.StateDir
	}
	store, err := state.Open(dir)
	if err != nil {
		return inv.fail(err)
	}
	inv.store = store
	if cmd == "drain" {
		return inv.drain(ctx, store)
	}
	if cmd != "status" {
		// Before the fleet is joined: an apply beside agent run must not take up (and
		// then revoke) the lease agent run recorded in the state directory.
		lock, err := acquireLock(ctx, store, o, cmd, inv.planArg)
		if err != nil {
			return inv.fail(err)
		}
		defer lock.Release()
	}
	var rollouts *agent.Rollouts
	if cmd == "apply" {
		j, err := joinForApply(p, store, inv.log, inv.gate)
		if err != nil {
			return inv.fail(err)
		}
		defer j.leave()
		inv.fleet, rollouts = j, j.rolloutsOf()
	}
	if drawsBars(inv.stdout, inv.stderr, os.Getenv) {
		inv.human.Term = inv.stderr
	}
	var progress func(agent.Progress)
	if !o.json {
		progress = inv.human.WorkProgress
	}
	if inv.saved != nil || o.out != "" {
		if inv.key, err = store.PlanKey(); err != nil {
			return inv.fail(err)
		}
	}
	eng, err := agent.New(p, inv.kinds, store, agent.Options{
		Progress:      progress,
		Parallelism:   o.parallelism,
		Targets:       o.targets,
		Log:           inv.log,
		HostOverride:  o.hostOverride,
		NoDestructive: o.noDestructive,
		// What left the plan leaves the host: plan shows it, apply deletes it (agent run
		// only with agent { prune = true }).
		Orphans:        agent.OrphansDelete,
		AllowDeleteAll: o.allowDelAll,
		Probe:          o.smoke,
		StepContext:    stopProgress(cmd, o.json, inv.human),
		Rollouts:       rollouts,
		FingerprintKey: inv.key,
		Hold:           holdDrained(cmd, store.Dir()),
	})
	if err != nil {
		return inv.fail(err)
	}

	switch cmd {
	case "plan":
		return inv.plan(ctx, eng)
	case "apply":
		return inv.apply(ctx, eng)
	case "destroy":
		return destroy(ctx, eng, inv.red, inv.human, o.json, inv.stdout)
	case "status":
		return inv.status(ctx, eng)
	}
	return ExitError
}

// show writes rep as the command's --json document, or for people through human.
func (inv *invocation) show(rep *agent.Report, human func(*agent.Report)) {
	if inv.o.json {
		view.WriteJSON(inv.stdout, view.JSON(inv.cmd, rep, inv.red))
	} else {
		human(rep)
	}
}

// plan shows the plan, and saves it with -out.
func (inv *invocation) plan(ctx context.Context, eng *agent.Engine) int {
	cmd, o, red := inv.cmd, inv.o, inv.red
	rep := eng.Plan(ctx)
	doc := view.JSON(cmd, rep, red)
	var text bytes.Buffer
	(&view.View{W: &text, Redact: red}).Plan(rep)
	if o.json {
		view.WriteJSON(inv.stdout, doc)
	} else {
		inv.stdout.Write(text.Bytes())
	}
	if o.out != "" {
		f, err := savePlan(rep, inv.p, inv.planArg, o, inv.store, inv.key, text.String(), doc)
		if err != nil {
			fmt.Fprintf(inv.stderr, "agent plan: %s\n", red.String(err.Error()))
			return ExitError
		}
		if !o.json {
			fmt.Fprintf(inv.stdout, "\nSaved this plan to %s (0600). Review it with `agent show %s`; apply exactly it with `agent apply %s`.\n", o.out, o.out, o.out)
		}
		inv.log.Info("plan saved", "file", o.out, "id", f.ID)
	}
	switch {
	case rep.Failed():
		return ExitError
	case rep.Changes():
		return ExitChanges
	}
	return ExitOK
}

// apply applies the plan, or the saved plan of apply FILE.
func (inv *invocation) apply(ctx context.Context, eng *agent.Engine) int {
	var onEvent func(agent.Event)
	if !inv.o.json {
		onEvent = inv.human.ApplyEvent
	}
	var rep *agent.Report
	if inv.saved != nil {
		var err error
		if rep, err = applySaved(ctx, eng, inv.saved, inv.planArg, inv.p, inv.o, inv.store, inv.key, inv.human); rep == nil {
			return inv.fail(err)
		} else if err != nil {
			// Applied, but its outcome could not be recorded: the id was, as started.
			inv.log.Error("record the saved plan's outcome", "err", err)
		}
	} else {
		rep = eng.Apply(ctx, onEvent)
	}
	inv.show(rep, inv.human.ApplySummary)
	if inv.finishHost(ctx, eng, rep) || rep.Failed() {
		return ExitError
	}
	return ExitOK
}

// status shows the running daemon's last observation, or observes now (--smoke, or no
// daemon).
func (inv *invocation) status(ctx context.Context, eng *agent.Engine) int {
	// --smoke probes now, here: the daemon's status is its last cheap observation.
	if !inv.o.smoke {
		if code, ok := statusFromDaemon(inv.p, inv.store.Dir(), inv.o.json, inv.stdout, inv.red); ok {
			return code
		}
	}
	rep := eng.Status(ctx)
	inv.show(rep, inv.human.Status)
	if rep.Failed() {
		return ExitError
	}
	if rep.Degraded() {
		return ExitDegraded
	}
	return ExitOK
}

// loadPlan loads and binds a plan: everything `agent validate` checks.
func loadPlan(path string, o options, kinds []agent.Kind) (*plans.Plan, hcl.Diagnostics) {
	p, diags := plans.Load(path, plans.Options{
		Schemas:  agent.Schemas(kinds),
		Vars:     o.vars,
		VarFiles: o.varFiles,
		Environ:  os.Environ(),
	})
	if p != nil {
		// Also with errors: every resource that decoded, fully or partly, gets its kind's
		// checks, so that one run reports every error (plans.Resource.Unknown).
		_, bindDiags := agent.Bind(p, kinds)
		diags = append(diags, bindDiags...)
		plans.SortDiagnostics(diags)
	}
	return p, diags
}

func invalid(cmd string, p *plans.Plan, diags hcl.Diagnostics, asJSON bool, stdout, stderr io.Writer) int {
	if asJSON {
		view.WriteJSON(stdout, view.DiagnosticsJSON(cmd, plans.DiagnosticsJSON(diags)))
		return ExitError
	}
	var files map[string]*hcl.File
	if p != nil {
		files = p.Files
	}
	plans.WriteDiagnostics(stderr, files, diags)
	return ExitError
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, errors.New("--log-level: want debug, info, warn or error")
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// stopProgress is the engine's StepContext of apply and destroy for people: a stop
// that waits for a server to exit prints where it stands every few seconds
// (internal/proc measures, the view prints), instead of a minute of silence before
// "deleted and verified"; under apply, so does a wait for the fleet's host permit
// (fleet.WithHostWait: who holds it). --json prints one document, so nothing there.
func stopProgress(cmd string, asJSON bool, human *view.View) func(context.Context, string) context.Context {
	if asJSON || (cmd != "apply" && cmd != "destroy") {
		return nil
	}
	return func(ctx context.Context, addr string) context.Context {
		if cmd == "apply" {
			ctx = fleet.WithHostWait(ctx, func(s string) { human.Progress(addr, s) })
		}
		return proc.WithStopProgress(ctx, proc.DefaultStopProgressEvery, func(p proc.StopProgress) {
			human.Progress(addr, "stopping "+p.String())
		})
	}
}

// drawsBars reports whether long work's progress may be drawn as bars, with escape codes
// that redraw them in place: only when stdout and stderr (where they go) are both
// terminals, NO_COLOR is unset (no-color.org: no escape codes at all then) and TERM is
// not "dumb". Otherwise (a file, a pipe, the journal) the view prints a plain progress
// line every 30 s instead.
func drawsBars(stdout, stderr io.Writer, getenv func(string) string) bool {
	tty := func(w io.Writer) bool {
		f, ok := w.(*os.File)
		return ok && term.IsTerminal(int(f.Fd()))
	}
	return tty(stdout) && tty(stderr) && getenv("NO_COLOR") == "" && getenv("TERM") != "dumb"
}

// holdDrained is the engine's Hold of plan and apply: a drained host's servers are held
// (agent drain --undo relaunches them); status observes them as they are, destroy
// removes them.
func holdDrained(cmd, stateDir string) func(string) error {
	if cmd != "plan" && cmd != "apply" {
		return nil
	}
	return drain.Hold(stateDir)
}
