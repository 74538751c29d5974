package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/plans"
)

// FormatVersion is the version of the --json output schema (docs/json-output.md). It
// changes only when a field changes meaning or disappears; new fields keep it.
const FormatVersion = "3"

// Redactor replaces secret values in text that reaches people or machines. Per-attribute
// Sensitive flags keep known secrets out of diffs; the redactor is the backstop for
// error messages and anything else that might quote a secret.
type Redactor struct{ secrets []string }

// NewRedactor redacts the given values (a plan's Secrets).
func NewRedactor(secrets []string) *Redactor { return &Redactor{secrets: secrets} }

// String returns s with every secret replaced by "(sensitive)".
func (r *Redactor) String(s string) string {
	if r == nil {
		return s
	}
	for _, sec := range r.secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, "(sensitive)")
		}
	}
	return s
}

// View renders reports for people.
type View struct {
	W      io.Writer
	Redact *Redactor
	// mu keeps lines whole: progress (Progress) comes from the goroutine of the step
	// that reports it, beside the engine's events.
	mu sync.Mutex
}

func (v *View) printf(format string, args ...any) {
	line := v.Redact.String(fmt.Sprintf(format, args...))
	v.mu.Lock()
	defer v.mu.Unlock()
	fmt.Fprint(v.W, line)
}

// Progress prints where a long step of addr stands, between its start and done events
// ("  … server.qwen: stopping pid 4711, 10 s of 30 s, SIGTERM sent; 1 process left").
func (v *View) Progress(addr, what string) {
	v.printf("  … %s: %s\n", addr, what)
}

// Plan prints the diff of a plan run, terraform-style.
func (v *View) Plan(rep *Report) {
	changed := 0
	for _, st := range rep.Steps {
		v.moved(st)
		if st.Err != nil {
			v.printf("  ! %s: %s\n", st.Addr, errLine(st.Addr, st.Err))
			continue
		}
		if st.Diff.Action == NoOp {
			v.warnings(st)
			continue
		}
		changed++
		v.diff(st)
	}
	for _, r := range rep.Rollouts {
		if r.Disruptions.Total() > 0 {
			v.printf("  %s\n", r)
		}
	}
	s := rep.Summary()
	switch {
	case rep.Failed():
		v.printf("\nPlan incomplete: %d resources could not be observed.\n", countErrs(rep))
	case changed == 0:
		v.printf("No changes. The host matches the plan (%d resources).\n", len(rep.Steps))
	default:
		v.printf("\nPlan: %s.\n", s)
	}
}

func countErrs(rep *Report) int {
	n := 0
	for _, st := range rep.Steps {
		if st.Err != nil {
			n++
		}
	}
	return n
}

// moved says that a moved block renames the resource (its record moves; nothing restarts).
func (v *View) moved(st *Step) {
	if st.MovedFrom != "" {
		v.printf("  %s has moved to %s (its record moves; nothing restarts)\n", st.MovedFrom, st.Addr)
	}
}

func (v *View) warnings(st *Step) {
	for _, w := range st.Diff.Warnings {
		v.printf("  ! %s: %s\n", st.Addr, w)
	}
}

// diff prints one resource's changes.
func (v *View) diff(st *Step) {
	d := st.Diff
	v.printf("  %s %s (%s)\n", d.Action.Symbol(), st.Addr, d.Action)
	for _, c := range d.Changes {
		v.printf("      %s\n", changeLine(c))
		for _, l := range changeMore(c) {
			v.printf("            %s\n", l)
		}
		if c.Text != "" && !c.Sensitive {
			for _, line := range strings.Split(strings.TrimRight(c.Text, "\n"), "\n") {
				v.printf("          %s\n", line)
			}
		}
	}
	for _, w := range d.Warnings {
		v.printf("      ! %s\n", w)
	}
}

// changeMore is what a change shows below its line: a command line's flags, one per
// line (all of them when it appears, the ones that differ when it changes).
func changeMore(c Change) []string {
	if c.Sensitive {
		return nil
	}
	o, oldCmd := c.Old.(CommandLine)
	n, newCmd := c.New.(CommandLine)
	switch {
	case c.HasOld && c.HasNew && oldCmd && newCmd:
		return commandLineDiff(o, n)
	case c.HasNew && !c.HasOld && newCmd:
		return n.lines()
	case c.HasOld && !c.HasNew && oldCmd:
		return o.lines()
	}
	return nil
}

func changeLine(c Change) string {
	if !c.Sensitive && len(changeMore(c)) > 0 {
		// The lines below say it all; the head says what kind of change it is.
		sym := map[bool]string{true: "+", false: "~"}[!c.HasOld]
		if !c.HasNew {
			sym = "-"
		}
		line := sym + " " + c.Attr
		if note := noteOf(c); note != "" {
			line += "  (" + note + ")"
		}
		return line
	}
	sym := "~"
	switch {
	case c.HasNew && !c.HasOld:
		sym = "+"
	case c.HasOld && !c.HasNew:
		sym = "-"
	}
	old, new := Render(c.Old), Render(c.New)
	var val string
	switch {
	case c.Sensitive:
		// One word for both sides: "(sensitive) → (sensitive)" says nothing more, and
		// the symbol already says whether it is added, changed or removed.
		val = "(sensitive)"
	case c.HasOld && c.HasNew:
		val = old + " → " + new
	case c.HasNew:
		val = new
	case c.HasOld:
		val = old
	}
	line := sym + " " + c.Attr
	if val != "" {
		line += ": " + val
	}
	if note := noteOf(c); note != "" {
		line += "  (" + note + ")"
	}
	return strings.TrimRight(line, " ")
}

// noteOf is what the human view says after a change: the kind's note, else what its
// effect means when that is more than an in-place change.
func noteOf(c Change) string {
	if c.Note != "" {
		return c.Note
	}
	switch c.EffectOf() {
	case Restarts:
		return "restart"
	case Replaces:
		return "forces replacement"
	case Deletes:
		return c.Why().Describe()
	}
	return ""
}

// errLine is an error as shown after "ADDR: ": without the address it already starts with.
func errLine(addr string, err error) string {
	return strings.TrimPrefix(err.Error(), addr+": ")
}

// ApplyEvent prints one apply event as it happens.
func (v *View) ApplyEvent(ev Event) {
	st := ev.Step
	switch ev.Phase {
	case "start":
		v.diff(st)
		v.printf("  … %s: %s\n", st.Addr, progressive(st.Diff.Action))
	case "done":
		switch {
		case st.Err != nil:
			var re *RolloutError
			if errors.As(st.Err, &re) {
				v.printf("  - %s: skipped: %s\n", st.Addr, re.Error())
			} else if cause, ok := st.Skipped(); ok {
				v.printf("  - %s: skipped, because %s failed\n", st.Addr, cause)
			} else {
				v.printf("  ✗ %s: %s\n", st.Addr, errLine(st.Addr, st.Err))
			}
		case st.Applied && st.Diff.Action == Adopt:
			v.printf("  ✓ %s: adopted, no restart; verified (%s)\n", st.Addr, st.Duration.Round(time.Millisecond))
		case st.Applied:
			v.printf("  ✓ %s: %s and verified (%s)\n", st.Addr, past(st.Diff.Action), st.Duration.Round(time.Millisecond))
		}
	case "finished":
		v.printf("  ✓ %s: finished and verified: %s\n", st.Addr, st.Finished)
	}
}

// ApplySummary prints the closing line of an apply.
func (v *View) ApplySummary(rep *Report) { v.summary(rep, "Apply") }

// DestroySummary prints the closing line of agent destroy.
func (v *View) DestroySummary(rep *Report) { v.summary(rep, "Destroy") }

func (v *View) summary(rep *Report, verb string) {
	applied, failed, skipped := 0, 0, 0
	for _, st := range rep.Steps {
		switch {
		case st.Err != nil:
			if _, ok := st.Skipped(); ok {
				skipped++
			} else {
				failed++
			}
		case st.Applied:
			applied++
		}
		if st.Diff != nil && st.Err == nil {
			v.warnings(st)
		}
	}
	finished := 0
	for _, st := range rep.Steps {
		if st.Finished != "" {
			finished++
		}
	}
	switch {
	case failed > 0:
		v.printf("\n%s failed: %d changed, %d failed, %d skipped.\n", verb, applied, failed, skipped)
	case applied == 0 && finished > 0:
		v.printf("\n%s complete: %d finished (make before break), all verified; nothing else changed.\n", verb, finished)
	case applied == 0:
		v.printf("No changes. The host matches the plan (%d resources).\n", len(rep.Steps))
	default:
		v.printf("\n%s complete: %d changed, all verified; %d unchanged.\n", verb, applied, len(rep.Steps)-applied)
	}
}

func progressive(a Action) string {
	switch a {
	case Adopt:
		return "adopting"
	case Create:
		return "creating"
	case Update:
		return "updating"
	case Restart:
		return "restarting"
	case Replace:
		return "replacing"
	case Delete:
		return "deleting"
	}
	return string(a)
}

func past(a Action) string {
	switch a {
	case Adopt:
		return "adopted"
	case Create:
		return "created"
	case Update:
		return "updated"
	case Restart:
		return "restarted"
	case Replace:
		return "replaced"
	case Delete:
		return "deleted"
	}
	return string(a)
}

// Status prints live status: one line per resource, then its fields.
func (v *View) Status(rep *Report) {
	for _, st := range rep.Steps {
		switch {
		case st.Err != nil:
			v.printf("  ✗ %s: %s\n", st.Addr, errLine(st.Addr, st.Err))
			continue
		case st.Status.Healthy:
			v.printf("  ✓ %s: %s\n", st.Addr, st.Status.Summary)
		default:
			v.printf("  ! %s: %s\n", st.Addr, st.Status.Summary)
		}
		width := 0
		for _, f := range st.Status.Fields {
			width = max(width, len(f.Name))
		}
		for _, f := range st.Status.Fields {
			v.printf("      %-*s  %s\n", width, f.Name, f.Text)
		}
	}
	v.members(rep)
}

// Degraded reports whether a status report has an unhealthy or failed resource.
func (rep *Report) Degraded() bool {
	for _, st := range rep.Steps {
		if st.Err != nil || st.Status == nil || !st.Status.Healthy {
			return true
		}
	}
	return false
}

// JSONOutput is the --json document of plan, apply, status, destroy and validate
// (docs/json-output.md, docs/schema/output-v3.json). Every field without omitempty is
// always present, with an empty value when there is nothing to say; NewJSONOutput fills
// them for a command.
type JSONOutput struct {
	FormatVersion string `json:"format_version"`
	Command       string `json:"command"`
	OK            bool   `json:"ok"`
	// Error is what failed before any resource ran (lock held, wrong host, an invalid
	// plan); "" otherwise.
	Error string `json:"error"`
	// Summary counts resources per action: plan, apply and destroy only.
	Summary     *Summary               `json:"summary,omitempty"`
	Resources   []JSONResource         `json:"resources"`
	Diagnostics []plans.JSONDiagnostic `json:"diagnostics"`
	// Rollouts are the plan's rollout groups (plan only; [] when it has none):
	// disruptions, and at most how many at a time.
	Rollouts []RolloutSummary `json:"rollouts,omitzero"`
	// StateDir is set by `agent run`'s /status, so `agent status` can tell whether the
	// daemon answering manages the same host state.
	StateDir string `json:"state_dir,omitempty"`
}

// NewJSONOutput is an empty document of command: every always-present field set, the
// summary only for the commands that act (plan, apply, destroy), rollouts for plan.
func NewJSONOutput(command string) *JSONOutput {
	out := &JSONOutput{FormatVersion: FormatVersion, Command: command,
		Resources: []JSONResource{}, Diagnostics: []plans.JSONDiagnostic{}}
	if acts(command) {
		out.Summary = &Summary{}
	}
	if command == "plan" {
		out.Rollouts = []RolloutSummary{}
	}
	return out
}

// ErrorJSON is the document of a command that failed before any resource ran: lock held,
// wrong host, state dir refused. msg must already be redacted.
func ErrorJSON(command, msg string) *JSONOutput {
	out := NewJSONOutput(command)
	out.Error = msg
	return out
}

// DiagnosticsJSON is the document of validate, or of a command whose plan is invalid:
// ok when no diagnostic is an error.
func DiagnosticsJSON(command string, diags []plans.JSONDiagnostic) *JSONOutput {
	out := NewJSONOutput(command)
	out.Diagnostics = append(out.Diagnostics, diags...)
	errs := 0
	for _, d := range diags {
		if d.Severity == "error" {
			errs++
		}
	}
	out.OK = errs == 0
	if errs > 0 {
		noun := "errors"
		if errs == 1 {
			noun = "error"
		}
		out.Error = fmt.Sprintf("the plan is invalid: %d %s, listed in diagnostics", errs, noun)
	}
	return out
}

// acts reports whether command changes the host or plans to (it has a summary, and its
// resources say whether they were applied).
func acts(command string) bool {
	return command == "plan" || command == "apply" || command == "destroy"
}

// JSONResource is one resource in JSONOutput. Applied is present for apply and destroy,
// Status for status; every other field always.
type JSONResource struct {
	Address string `json:"address"`
	Type    string `json:"type"`
	Name    string `json:"name"`
	// Action is "" when nothing was observed to derive one from (its Check failed, or a
	// status that its kind observes itself).
	Action   Action       `json:"action"`
	Changes  []JSONChange `json:"changes"`
	Warnings []string     `json:"warnings"`
	Applied  *bool        `json:"applied,omitempty"`
	// Finished (apply and destroy) says what break work of a make-before-break change
	// this run finished and verified after the resource's dependents verified: a
	// migrated container's old instance deleted ("" when none).
	Finished *string `json:"finished,omitempty"`
	Status   *Status `json:"status,omitempty"`
	Error    string  `json:"error"`
	// SkippedBecause names the failed resource this one depends on ("" when it ran).
	SkippedBecause string `json:"skipped_because"`
	DurationMS     int64  `json:"duration_ms"`
	// Orphan: recorded in state, its block gone from the plan.
	Orphan bool `json:"orphan"`
	// MovedFrom is the address a moved block renamed this resource from ("" when none).
	MovedFrom string `json:"moved_from"`
}

// JSONChange is one attribute change; old and new are absent when the attribute is
// absent on that side or sensitive. They are JSON values of the attribute's own type (a
// number is a number, a list a list), never a rendering.
type JSONChange struct {
	Attribute string `json:"attribute"`
	Old       any    `json:"old,omitempty"`
	New       any    `json:"new,omitempty"`
	Sensitive bool   `json:"sensitive"`
	Effect    Effect `json:"effect"`
	Reason    Reason `json:"reason"`
	Note      string `json:"note"`
	Text      string `json:"text"`
}

// jsonValue is v as a plain JSON value (strings, numbers, booleans, lists, objects) with
// secrets redacted from every string in it.
func jsonValue(v any, r *Redactor) any {
	data, err := json.Marshal(v)
	if err != nil {
		return r.String(fmt.Sprint(v))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		return r.String(string(data))
	}
	return redactValue(out, r)
}

func redactValue(v any, r *Redactor) any {
	switch v := v.(type) {
	case string:
		return r.String(v)
	case []any:
		for i := range v {
			v[i] = redactValue(v[i], r)
		}
	case map[string]any:
		for k, x := range v {
			v[k] = redactValue(x, r)
		}
	}
	return v
}

// JSON converts a report to its --json document.
func JSON(command string, rep *Report, p *plans.Plan, r *Redactor) *JSONOutput {
	out := NewJSONOutput(command)
	out.OK = !rep.Failed()
	if out.Summary != nil {
		s := rep.Summary()
		out.Summary = &s
	}
	if command == "plan" {
		out.Rollouts = append(out.Rollouts, rep.Rollouts...)
	}
	for _, st := range rep.Steps {
		out.Resources = append(out.Resources, jsonResource(command, st, r))
	}
	if command == "status" {
		out.OK = !rep.Degraded()
	}
	return out
}

// jsonResource is one step of a report as command's document shows it.
func jsonResource(command string, st *Step, r *Redactor) JSONResource {
	typ, name, _ := strings.Cut(st.Addr, ".")
	jr := JSONResource{Address: st.Addr, Type: typ, Name: name, Changes: []JSONChange{}, Warnings: []string{},
		DurationMS: st.Duration.Milliseconds(), Orphan: st.Orphan, MovedFrom: st.MovedFrom}
	if command == "apply" || command == "destroy" {
		jr.Applied = &st.Applied
		jr.Finished = &st.Finished
	}
	if st.Err != nil {
		if cause, ok := st.Skipped(); ok {
			jr.SkippedBecause = cause
		}
		jr.Error = r.String(st.Err.Error())
	}
	if d := st.Diff; d != nil {
		jr.Action = d.Action
		for _, w := range d.Warnings {
			jr.Warnings = append(jr.Warnings, r.String(w))
		}
		for _, c := range d.Changes {
			jc := JSONChange{Attribute: c.Attr, Sensitive: c.Sensitive, Effect: c.EffectOf(), Reason: c.Why(), Note: r.String(c.Note)}
			if !c.Sensitive {
				if c.HasOld {
					jc.Old = jsonValue(c.Old, r)
				}
				if c.HasNew {
					jc.New = jsonValue(c.New, r)
				}
				jc.Text = r.String(c.Text)
			}
			jr.Changes = append(jr.Changes, jc)
		}
	}
	if command == "status" {
		jr.Status = jsonStatus(st.Status, r)
	}
	return jr
}

// jsonStatus is a status as the document shows it: never null, its lists and maps empty
// rather than absent (a failed status is {healthy: false, summary: "", ...}), secrets
// redacted.
func jsonStatus(in *Status, r *Redactor) *Status {
	s := &Status{Fields: []Field{}, Metrics: map[string]float64{}}
	if in == nil {
		return s
	}
	s.Healthy, s.Summary = in.Healthy, r.String(in.Summary)
	for _, f := range in.Fields {
		if v, ok := f.Value.(string); ok {
			f.Value = r.String(v)
		}
		f.Text = r.String(f.Text)
		s.Fields = append(s.Fields, f)
	}
	for k, v := range in.Metrics {
		s.Metrics[k] = v
	}
	return s
}

// WriteJSON writes a document as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
