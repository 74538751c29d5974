package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/savedplan"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
)

// Saved plans: `agent plan -out FILE PLAN` writes what it printed and what it observed
// (internal/savedplan), `agent apply FILE` applies exactly that when the host and the
// plan still match it (agent.Engine.ApplySaved), `agent show FILE` prints it.

// savedOnly are the options a saved plan keeps: apply FILE takes them from the file.
var savedOnly = []string{"target", "no-destructive", "allow-delete-all", "host-override"}

// openSaved reads the saved plan an `agent apply FILE` names and makes o what it was
// planned with: its plan, variables (plus any -var and -var-file given now, for sensitive
// ones), targets and options, and its state directory. usage reports an error of the
// command line.
func openSaved(path string, fs *flag.FlagSet, o *options) (f *savedplan.File, usage bool, err error) {
	var given []string
	fs.Visit(func(fl *flag.Flag) {
		for _, n := range savedOnly {
			if fl.Name == n {
				given = append(given, "--"+n)
			}
		}
	})
	if len(given) > 0 {
		return nil, true, fmt.Errorf("%s: a saved plan applies with the options it was planned with; pass them to agent plan -out instead", strings.Join(given, ", "))
	}
	if f, err = savedplan.Read(path); err != nil {
		return nil, false, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, false, err
	}
	if f.Host != host {
		return nil, false, fmt.Errorf("%s was saved on host %q and this is %q: a saved plan applies only to the host it observed", path, f.Host, host)
	}
	if o.stateDir != "" {
		abs, err := filepath.Abs(o.stateDir)
		if err != nil {
			return nil, false, err
		}
		if abs != f.StateDir {
			return nil, false, fmt.Errorf("%s was planned against the state directory %s, not %s: leave --state-dir out", path, f.StateDir, abs)
		}
	}
	o.stateDir = f.StateDir
	o.vars = append(append(multi{}, f.Source.Vars...), o.vars...)
	o.varFiles = append(append(multi{}, f.Source.VarFiles...), o.varFiles...)
	o.targets = append(multi{}, f.Options.Targets...)
	o.noDestructive, o.allowDelAll, o.hostOverride = f.Options.NoDestructive, f.Options.AllowDeleteAll, f.Options.HostOverride
	return f, false, nil
}

// savePlan writes the saved plan of rep (a plan run with a fingerprint key) to o.out:
// text is what the plan printed for people, doc its --json document.
func savePlan(rep *agent.Report, p *plans.Plan, planPath string, o options, store *state.Store, key []byte, text string, doc *view.JSONOutput) (*savedplan.File, error) {
	if rep.Failed() {
		return nil, fmt.Errorf("the plan was not saved to %s: it is incomplete (the resources above could not be observed); a saved plan binds every resource's observation", o.out)
	}
	id, err := savedplan.NewID()
	if err != nil {
		return nil, err
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, err
	}
	abs := func(ps []string) []string {
		out := make([]string, 0, len(ps))
		for _, p := range ps {
			a, err := filepath.Abs(p)
			if err != nil {
				a = p
			}
			out = append(out, a)
		}
		return out
	}
	src, err := savedplan.Describe(p, abs([]string{planPath})[0], abs(o.varFiles), o.vars, key)
	if err != nil {
		return nil, err
	}
	var js bytes.Buffer
	if err := view.WriteJSON(&js, doc); err != nil {
		return nil, err
	}
	f := &savedplan.File{Format: savedplan.Format, Version: savedplan.Version, ID: id, CreatedAt: time.Now().UTC(),
		AgentVersion: Version, Host: host, StateDir: store.Dir(), Source: src,
		Options: savedplan.Options{Targets: append([]string{}, o.targets...), NoDestructive: o.noDestructive,
			AllowDeleteAll: o.allowDelAll, HostOverride: o.hostOverride},
		Text: text, Document: js.Bytes()}
	for _, st := range rep.Steps {
		f.Resources = append(f.Resources, savedplan.Resource{Address: st.Addr, Fingerprint: *st.Fingerprint})
	}
	return f, savedplan.Write(o.out, f)
}

// applySaved is `agent apply FILE` once the plan is loaded and the lock held: refused
// when the file was applied already, when the plan's sources or variables changed, or
// when any resource's observation changed (agent.StaleError); otherwise the engine's one
// Apply, each step vetted against its fingerprint. The id is recorded before anything
// is done, and the outcome after.
func applySaved(ctx context.Context, eng *agent.Engine, f *savedplan.File, path string, p *plans.Plan, o options, store *state.Store, key []byte, human *view.View) (*agent.Report, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	applied, err := store.AppliedPlans()
	if err != nil {
		return nil, err
	}
	if a, ok := applied[f.ID]; ok {
		return nil, fmt.Errorf("%s (id %s) was already applied, at %s (%s, from %s): a saved plan is applied once; make a new one with agent plan -out", path, f.ID, a.At.Format(time.RFC3339), a.Outcome, a.File)
	}
	now, err := savedplan.Describe(p, f.Source.Path, f.Source.VarFiles, nil, key)
	if err != nil {
		return nil, err
	}
	if diffs := f.Source.Differences(now); len(diffs) > 0 {
		return nil, fmt.Errorf("the plan changed since %s was saved; nothing was applied: make a new plan (agent plan -out), review it, and apply that\n  %s", path, strings.Join(diffs, "\n  "))
	}
	var onEvent func(agent.Event)
	if !o.json {
		onEvent = human.ApplyEvent
	}
	record := func(outcome string) error {
		return store.RecordAppliedPlan(f.ID, state.AppliedPlan{File: abs, At: time.Now().UTC(), Outcome: outcome})
	}
	begin := func() error {
		if err := record("started"); err != nil {
			return err
		}
		if !o.json {
			fmt.Fprintf(human.W, "Every resource observed again matches %s (saved %s): applying exactly it.\n", path, f.CreatedAt.Format(time.RFC3339))
		}
		return nil
	}
	rep, err := eng.ApplySaved(ctx, f.Fingerprints(), begin, onEvent)
	if err != nil {
		return nil, err
	}
	outcome := "applied"
	if rep.Failed() {
		outcome = "failed"
	}
	if err := record(outcome); err != nil {
		return rep, err
	}
	return rep, nil
}

// runShow is `agent show FILE`: a saved plan as `agent plan` printed it, or its --json
// document, read from the file alone (no plan, no state, no host).
func runShow(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent show", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "the plan's --json document, as agent plan --json printed it (docs/json-output.md)")
	pos, code, ok := parseArgs("show", fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "agent show: want exactly one FILE (written by agent plan -out), got %d arguments\n", len(pos))
		return exitUsage
	}
	f, err := savedplan.Read(pos[0])
	if err != nil {
		if *asJSON {
			view.WriteJSON(stdout, view.ErrorJSON("plan", err.Error()))
		} else {
			fmt.Fprintf(stderr, "agent show: %v\n", err)
		}
		return ExitError
	}
	if *asJSON {
		// As agent plan --json printed it: the file nests it, indented one level deeper.
		var doc bytes.Buffer
		if err := json.Indent(&doc, f.Document, "", "  "); err != nil {
			fmt.Fprintf(stderr, "agent show: %s: corrupt document: %v\n", pos[0], err)
			return ExitError
		}
		doc.WriteByte('\n')
		stdout.Write(doc.Bytes())
		return ExitOK
	}
	fmt.Fprintf(stdout, "Saved plan %s: made %s on %s by agent %s, from %s.\n\n", pos[0],
		f.CreatedAt.Format(time.RFC3339), f.Host, f.AgentVersion, describeSource(f))
	io.WriteString(stdout, f.Text)
	fmt.Fprintf(stdout, "\nApply exactly this, if the host and the plan still match it: agent apply %s\n", pos[0])
	return ExitOK
}

// describeSource is the plan a saved plan was made from, as a command line.
func describeSource(f *savedplan.File) string {
	parts := []string{f.Source.Path}
	for _, v := range f.Source.VarFiles {
		parts = append(parts, "-var-file "+v)
	}
	for _, v := range f.Source.Vars {
		parts = append(parts, "-var "+v)
	}
	for _, t := range f.Options.Targets {
		parts = append(parts, "--target "+t)
	}
	if f.Options.NoDestructive {
		parts = append(parts, "--no-destructive")
	}
	if f.Options.AllowDeleteAll {
		parts = append(parts, "--allow-delete-all")
	}
	if f.Options.HostOverride != "" {
		parts = append(parts, "--host-override "+f.Options.HostOverride)
	}
	return strings.Join(parts, " ")
}
