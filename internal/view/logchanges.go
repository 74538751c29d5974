package view

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/agent"
)

// LogChanges is a diff's changes in the log: why a resource is about to be restarted or
// replaced, in the journal, each change its own structured attribute (LogValue). String
// is the same on one line, for people (`env["HF_TOKEN"] (sensitive value) (restart:
// identity changed); flags["port"]: 30000 → 30001 (restart: identity changed)`). A
// sensitive change names its attribute, effect and reason, never its values; the log's
// redacting handler remains the backstop for values that quote a secret.
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

// LogValue makes each change its own structured attribute, in the text log and the JSON
// log alike: a group per change, keyed by its attribute without quotes
// (`changes.flags.port.old=30000 changes.flags.port.new=30001
// changes.flags.port.effect=restart changes.flags.port.reason=identity`), instead of one
// long field of escaped quotes. A sensitive change has sensitive=true and no values.
func (l LogChanges) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, len(l))
	seen := map[string]int{}
	for _, c := range l {
		key := logKey(c.Attr)
		if seen[key]++; seen[key] > 1 {
			key += "#" + strconv.Itoa(seen[key])
		}
		var a []any
		switch {
		case c.Sensitive:
			a = append(a, slog.Bool("sensitive", true))
		case len(changeMore(c)) > 0: // a command line: only the flags that differ
			a = append(a, slog.String("differs", strings.Join(changeMore(c), ", ")))
		default:
			if c.HasOld {
				a = append(a, slog.Any("old", logAttrValue(c.Old)))
			}
			if c.HasNew {
				a = append(a, slog.Any("new", logAttrValue(c.New)))
			}
		}
		a = append(a, slog.String("effect", string(c.EffectOf())), slog.String("reason", string(c.Why())))
		if c.Note != "" {
			a = append(a, slog.String("note", c.Note))
		}
		attrs = append(attrs, slog.Group(key, a...))
	}
	return slog.GroupValue(attrs...)
}

// logKey is an attribute path as a log key: flags["tp-size"] → flags.tp-size.
func logKey(attr string) string {
	r := strings.NewReplacer(`["`, ".", `"]`, "", `"`, "", " ", "_", "=", "_")
	return r.Replace(attr)
}

// logAttrValue is a value as a log attribute: numbers and booleans as they are,
// strings bare (the handler quotes them when needed), the rest as a plan writes it,
// cut at maxLogValue.
func logAttrValue(v any) any {
	switch v := v.(type) {
	case bool, int, int64, uint64, float64:
		return v
	case string:
		if r := []rune(v); len(r) > maxLogValue {
			return string(r[:maxLogValue]) + "…"
		}
		return v
	case fmt.Stringer:
		return v.String()
	}
	return logValue(v)
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
