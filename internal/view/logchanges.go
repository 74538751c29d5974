package view

import (
	"encoding/json"
	"strings"

	"github.com/agent-dev/agent/agent"
)

// LogChanges is a diff's changes as one log attribute: why a resource is about to be
// restarted or replaced, in the journal. A text log reads it as one line
// (`env["HF_TOKEN"] (sensitive value) (restart: identity changed); flags["port"]: 30000 →
// 30001 (restart: identity changed)`); a JSON log as a list of the --json output's change
// objects. A sensitive change names its attribute, effect and reason, never its values;
// the log's redacting handler remains the backstop for values that quote a secret.
type LogChanges []agent.Change

// maxLogValue bounds one rendered value in a log line: file content or a long list says
// nothing more after a line's worth.
const maxLogValue = 120

// String is the text form (also what the redacting handler compares).
func (l LogChanges) String() string {
	parts := make([]string, len(l))
	for i, c := range l {
		parts[i] = logChange(c)
	}
	return strings.Join(parts, "; ")
}

// MarshalText makes slog's text handler write the one-line form.
func (l LogChanges) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// MarshalJSON makes slog's JSON handler write the changes as --json does.
func (l LogChanges) MarshalJSON() ([]byte, error) {
	out := make([]JSONChange, len(l))
	for i, c := range l {
		jc := JSONChange{Attribute: c.Attr, Sensitive: c.Sensitive, Effect: c.EffectOf(), Reason: c.Why(), Note: c.Note}
		if !c.Sensitive {
			if c.HasOld {
				jc.Old = jsonValue(c.Old, nil)
			}
			if c.HasNew {
				jc.New = jsonValue(c.New, nil)
			}
		}
		out[i] = jc
	}
	return json.Marshal(out)
}

// logChange is one change on one line: the attribute, its values unless sensitive, then
// its effect and reason.
func logChange(c agent.Change) string {
	var b strings.Builder
	b.WriteString(c.Attr)
	switch {
	case c.Sensitive:
		b.WriteString(" (sensitive value)")
	case len(changeMore(c)) > 0: // a command line: only the flags that differ
		b.WriteString(": " + strings.Join(changeMore(c), ", "))
	case c.HasOld && c.HasNew:
		b.WriteString(": " + logValue(c.Old) + " → " + logValue(c.New))
	case c.HasNew:
		b.WriteString(": none → " + logValue(c.New))
	case c.HasOld:
		b.WriteString(": " + logValue(c.Old) + " → none")
	}
	b.WriteString(" (" + string(c.EffectOf()) + ": " + c.Why().Describe())
	if c.Note != "" {
		b.WriteString("; " + c.Note)
	}
	b.WriteString(")")
	return b.String()
}

func logValue(v any) string {
	s := agent.Render(v)
	if r := []rune(s); len(r) > maxLogValue {
		s = string(r[:maxLogValue]) + "…"
	}
	return s
}
