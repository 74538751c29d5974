package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/resources/registry"
)

// runFleet is `agent fleet release HOST PLAN`: an operator frees the host permit of a
// host that does not come back (kured's manual unlock), logged in etcd with who and when.
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent fleet", flag.ContinueOnError)
	var o options
	fs.Var(&o.vars, "var", "`NAME=VALUE`: set a variable (repeatable)")
	fs.Var(&o.varFiles, "var-file", "`FILE`: read variables from an HCL file (repeatable)")
	reason := fs.String("reason", "", "`TEXT`: why, logged with the release")
	asJSON := fs.Bool("json", false, "the permits freed as JSON")
	pos, code, ok := parseArgs("fleet", fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) != 3 || pos[0] != "release" {
		fmt.Fprintf(stderr, "agent fleet: want `agent fleet release HOST PLAN`, got %q\n", pos)
		return exitUsage
	}
	host, planPath := pos[1], pos[2]
	p, diags := loadPlan(planPath, o, registry.Kinds())
	if diags.HasErrors() {
		return invalid("fleet", p, diags, false, stdout, stderr)
	}
	if p.Agent.Coordination == nil {
		fmt.Fprintf(stderr, "agent fleet release: the plan has no agent { coordination { etcd = [...] } } block: this host is in no fleet\n")
		return ExitError
	}
	c, err := fleet.Open(p.Agent.Coordination, nil, "")
	if err != nil {
		fmt.Fprintf(stderr, "agent fleet release: %v\n", err)
		return ExitError
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	freed, err := c.ForceReleaseHost(rctx, host, operator(), *reason)
	if err != nil {
		fmt.Fprintf(stderr, "agent fleet release: %v\n", err)
		return ExitError
	}
	if *asJSON {
		b, _ := json.MarshalIndent(map[string]any{"command": "fleet release", "ok": true, "released": freed}, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		return ExitOK
	}
	for _, f := range freed {
		fmt.Fprintf(stdout, "Released %s's host permit in group %s (%s, held %s), logged as by %s.\n",
			f.Host, f.Group, f, time.Since(f.Since).Round(time.Second), operator())
	}
	return ExitOK
}

// operator names who runs a command, for the fleet's log: the user behind sudo, else
// the user, at this host.
func operator() string {
	name := os.Getenv("SUDO_USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		} else {
			name = fmt.Sprintf("uid %d", os.Getuid())
		}
	}
	h, _ := os.Hostname()
	return name + "@" + h
}

// writeHostPermits prints the hosts under disruption: `kpro6 rebooting since 10:04
// (driver 580.95.05 → 590.48.01), permit held 12m`.
func writeHostPermits(w io.Writer, held []coord.HostPermit, now time.Time) {
	if len(held) == 0 {
		return
	}
	fmt.Fprintln(w, "Hosts under disruption:")
	for _, p := range held {
		fmt.Fprintf(w, "  %s, permit held %s (host group %s; agent fleet release %s frees it)\n", p.Headline(), heldFor(now.Sub(p.Since)), p.Group, p.Host)
		if f := p.Failure; f != nil {
			fmt.Fprintf(w, "    error: %s\n", view.Block{Text: f.Error, Indent: 11})
			fmt.Fprintf(w, "    host group %s is stopped: no other host starts until %s is verified (fix it: it resumes by itself) or freed\n", p.Group, p.Host)
		}
	}
}

// heldFor rounds a permit's age as people read it: seconds under a minute, then minutes.
func heldFor(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	return fmt.Sprintf("%dm", int(d/time.Minute))
}
