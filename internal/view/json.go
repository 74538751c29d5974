package view

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/plans"
)

// FormatVersion is the version of the --json output schema (docs/json-output.md). It
// changes only when a field changes meaning or disappears; new fields keep it.
const FormatVersion = "3"

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
	Summary     *agent.Summary         `json:"summary,omitempty"`
	Resources   []JSONResource         `json:"resources"`
	Diagnostics []plans.JSONDiagnostic `json:"diagnostics"`
	// Rollouts are the plan's rollout groups (plan only; [] when it has none):
	// disruptions, and at most how many at a time.
	Rollouts []agent.RolloutSummary `json:"rollouts,omitzero"`
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
		out.Summary = &agent.Summary{}
	}
	if command == "plan" {
		out.Rollouts = []agent.RolloutSummary{}
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
	Action   agent.Action `json:"action"`
	Changes  []JSONChange `json:"changes"`
	Warnings []string     `json:"warnings"`
	Applied  *bool        `json:"applied,omitempty"`
	// Finished (apply and destroy) says what break work of a make-before-break change
	// this run finished and verified after the resource's dependents verified: a
	// migrated container's old instance deleted ("" when none).
	Finished *string       `json:"finished,omitempty"`
	Status   *agent.Status `json:"status,omitempty"`
	Error    string        `json:"error"`
	// SkippedBecause names the failed resource this one depends on ("" when it ran).
	SkippedBecause string `json:"skipped_because"`
	DurationMS     int64  `json:"duration_ms"`
	// Orphan: recorded in state, its block gone from the plan.
	Orphan bool `json:"orphan"`
	// MovedFrom is the address a moved block renamed this resource from ("" when none).
	MovedFrom string `json:"moved_from"`
	// DeletedAfter, for an orphan, lists the planned resources whose current record
	// depends on it: it is deleted only after they are verified (absent when none).
	DeletedAfter []string `json:"deleted_after,omitempty"`
}

// JSONChange is one attribute change; old and new are absent when the attribute is
// absent on that side or sensitive. They are JSON values of the attribute's own type (a
// number is a number, a list a list), never a rendering.
type JSONChange struct {
	Attribute string       `json:"attribute"`
	Old       any          `json:"old,omitempty"`
	New       any          `json:"new,omitempty"`
	Sensitive bool         `json:"sensitive"`
	Effect    agent.Effect `json:"effect"`
	Reason    agent.Reason `json:"reason"`
	Note      string       `json:"note"`
	Text      string       `json:"text"`
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
func JSON(command string, rep *agent.Report, r *Redactor) *JSONOutput {
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
func jsonResource(command string, st *agent.Step, r *Redactor) JSONResource {
	typ, name, _ := strings.Cut(st.Addr, ".")
	jr := JSONResource{Address: st.Addr, Type: typ, Name: name, Changes: []JSONChange{}, Warnings: []string{},
		DurationMS: st.Duration.Milliseconds(), Orphan: st.Orphan, MovedFrom: st.MovedFrom}
	if st.Diff != nil && st.Diff.Action == agent.Delete {
		jr.DeletedAfter = st.DeletedAfter
	}
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
func jsonStatus(in *agent.Status, r *Redactor) *agent.Status {
	s := &agent.Status{Fields: []agent.Field{}, Metrics: map[string]float64{}, Series: []agent.Series{}, Faults: []agent.Fault{}}
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
	for _, x := range in.Series {
		labels := make(map[string]string, len(x.Labels))
		for k, v := range x.Labels {
			labels[k] = r.String(v)
		}
		x.Labels = labels
		s.Series = append(s.Series, x)
	}
	for _, f := range in.Faults {
		f.Text, f.Line = r.String(f.Text), r.String(f.Line)
		s.Faults = append(s.Faults, f)
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
