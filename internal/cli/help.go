package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/agent-dev/agent/plans"
)

// command is what `agent COMMAND --help` prints about one command, besides its flags.
type command struct {
	synopsis string // after "Usage: "
	about    string // what it does, its exit codes
	example  string // commands that work as written
}

// commands are the agent's commands, in the order the general usage lists them.
var commands = map[string]command{
	"validate": {"agent validate PLAN [flags]",
		"Parse and type-check a plan, without touching the host: every error in one run, each\nwith its place and fix. Exit 0 valid, 1 invalid.",
		"agent validate plan.hcl -var-file host.vars.hcl"},
	"plan": {"agent plan [-out FILE] PLAN [flags]",
		"Observe the host and show what apply would change, attribute by attribute, with the\neffect of each change (in-place, restart, replace, delete). Changes nothing.\nWith -out FILE, also save it, bound to what it observed: agent show FILE prints it,\nagent apply FILE applies exactly it. Exit 0 no changes, 2 changes, 1 error.",
		"agent plan plan.hcl -var mem_fraction=0.85"},
	"apply": {"agent apply PLAN|FILE [flags]",
		"Apply the plan in dependency order: each step observed again right before it acts and\nverified by a fresh observation after. Given a FILE saved by agent plan -out, apply\nexactly its changes, with its options, and only if every resource and the plan's files\nand variables still match what it observed (else exit 1, naming what changed, nothing\ntouched); a saved plan is applied once. Exit 0 applied, 1 a step failed or refused.",
		"agent apply plan.hcl --target server.qwen --no-destructive"},
	"status": {"agent status PLAN [flags]",
		"The live state of every resource (answered by `agent run` when it manages the same\nstate directory). Exit 0 healthy, 3 degraded, 1 error.",
		"agent status plan.hcl --json"},
	"show": {"agent show FILE [flags]",
		"Print a plan saved by agent plan -out as agent plan printed it, or its --json\ndocument: from the file alone, without the plan, the state or the host. Exit 0, 1 when\nFILE is not a saved plan.",
		"agent show migrate.plan"},
	"destroy": {"agent destroy PLAN [flags]",
		"Stop and remove everything the plan manages, dependents first, each removal verified.\nExit 0 done, 1 a step failed.",
		"agent destroy plan.hcl"},
	"run": {"agent run PLAN [flags]",
		"The reconcile loop, as a systemd service: keeps the host converged, reloads the plan\nwhen it changes (or on SIGHUP), serves /status, /metrics and /healthz (docs/service.md).",
		"agent run /etc/agent/plan.hcl --interval 30s --listen 127.0.0.1:9464"},
	"fmt": {"agent fmt [flags] [PLAN...]",
		"Rewrite plan files in canonical form (default: the *.hcl files of the current\ndirectory). With -check, change nothing: exit 3 when a file would change.",
		"agent fmt -check -diff plans/"},
	"export": {"agent export [flags] > host.hcl",
		"Observe this host (servers, weights, containers, the driver) and print a plan that\nreproduces it; it only reads (docs/export.md).",
		"agent export --hostname kpro5 > kpro5.hcl"},
	"drain": {"agent drain PLAN [--reason TEXT] [--undo] [flags]",
		"Stop every server of this host, verified, for hardware work; agent run and apply keep\nthem down until agent drain --undo, which relaunches them, verified, and releases the\nhost permit. With agent { coordination } the drain holds a host permit of its host group:\nrefused, the holder named, while none is free. Exit 0 done, 1 refused or failed.",
		"agent drain /etc/agent/plan.hcl --reason \"replace GPU 3\""},
	"fleet": {"agent fleet release HOST PLAN [flags]",
		"Free the host permit HOST holds (a host disruption whose host does not come back:\nthe rest of its host group waits for it), logged in etcd with who and when; agent\nstatus --fleet shows the permits held. Exit 0 freed, 1 none held or etcd unreachable.",
		"agent fleet release kpro6 /etc/agent/plan.hcl --reason \"board replaced\""},
	"version": {"agent version", "Print the version.", "agent version"},
}

// commandNames are the commands the general usage lists and misspellings are matched to.
func commandNames() []string {
	names := make([]string, 0, len(commands)+1)
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return append(names, "help")
}

// writeHelp prints `agent CMD --help`: the synopsis, what it does, its flags, an example.
func writeHelp(w io.Writer, cmd string, fs *flag.FlagSet) {
	c := commands[cmd]
	fmt.Fprintf(w, "Usage: %s\n\n%s\n", c.synopsis, c.about)
	if fs != nil {
		var rows [][2]string
		fs.VisitAll(func(f *flag.Flag) {
			arg, use := flag.UnquoteUsage(f)
			use = strings.TrimPrefix(use, arg+": ")
			name := "--" + f.Name
			if len(f.Name) <= 3 || f.Name == "var-file" || f.Name == "check" || f.Name == "diff" {
				name = "-" + f.Name // as the docs write them: -var, -var-file, fmt's -check
			}
			if arg != "" {
				name += " " + strings.ToUpper(arg)
			}
			if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" && f.DefValue != "[]" {
				use += " (default " + f.DefValue + ")"
			}
			rows = append(rows, [2]string{name, use})
		})
		if len(rows) > 0 {
			width := 0
			for _, r := range rows {
				width = max(width, len(r[0]))
			}
			fmt.Fprintf(w, "\nFlags (before or after the arguments):\n")
			for _, r := range rows {
				fmt.Fprintf(w, "  %-*s  %s\n", width, r[0], r[1])
			}
		}
	}
	fmt.Fprintf(w, "\nExample:\n  %s\n", c.example)
}

// parseArgs parses a command's flags (before or after its arguments). --help and -h
// print the command's help to stdout and end it with exit 0; a misspelt flag gets the
// closest one and a pointer to --help, exit 64.
func parseArgs(cmd string, fs *flag.FlagSet, args []string, stdout, stderr io.Writer) ([]string, int, bool) {
	fs.SetOutput(io.Discard) // the flag package's own usage is the generic one
	fs.Usage = func() {}
	pos, err := parseInterleaved(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		writeHelp(stdout, cmd, fs)
		return nil, ExitOK, false
	case err != nil:
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
			var names []string
			fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
			msg = "unknown flag " + name
			if s := plans.Closest(strings.TrimLeft(name, "-"), names); s != "" {
				msg += fmt.Sprintf(" (did you mean --%s?)", s)
			}
		}
		fmt.Fprintf(stderr, "agent %s: %s. Run 'agent %s --help' for its flags.\n", cmd, msg, cmd)
		return nil, exitUsage, false
	}
	return pos, 0, true
}

// unknownCommand is the answer to `agent aply`: the closest command, and the usage.
func unknownCommand(stderr io.Writer, cmd string) int {
	fmt.Fprintf(stderr, "agent: unknown command %q", cmd)
	if s := plans.Closest(cmd, commandNames()); s != "" {
		fmt.Fprintf(stderr, " (did you mean %q?)", s)
	}
	fmt.Fprintf(stderr, "\n\n%s", usage)
	return exitUsage
}
