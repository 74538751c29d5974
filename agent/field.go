package agent

import (
	"fmt"
	"strconv"
	"time"

	"github.com/agent-dev/agent/internal/bytesize"
)

// Field is one observed fact of a status, in two views: a stable key with a typed value
// for machines (--json, docs/json-output.md), a label with a rendering for people.
type Field struct {
	// Key is stable snake_case ("pid", "started_at"); a fact about one of several things
	// carries its index as the plan would write it: gpu[0], failure[1],
	// file["model.safetensors"]. Its ending says the value's unit: _at and _since are
	// times (RFC 3339 strings, UTC), _seconds durations, _bytes sizes in bytes.
	Key string `json:"key"`
	// Name is the label people read ("started", "newest line").
	Name string `json:"name"`
	// Value is a JSON string, number or boolean.
	Value any `json:"value"`
	// Text is the value as people read it ("2026-12-02 15:08:22 (5m8s ago)"): the human
	// status view prints it. It may say more than Value (a total, a unit, a cause).
	Text string `json:"text"`
}

// WithText returns f with text as its human rendering.
func (f Field) WithText(text string) Field {
	f.Text = text
	return f
}

// TextField is a fact that is words: a path, a state, a cause.
func TextField(key, name, text string) Field {
	return Field{Key: key, Name: name, Value: text, Text: text}
}

// NumberField is a count or a measure; people read it as Go prints it.
func NumberField[N ~int | ~int64 | ~uint64 | ~float64](key, name string, n N) Field {
	return Field{Key: key, Name: name, Value: n, Text: fmt.Sprint(n)}
}

// BoolField is a yes or no; people read "true" or "false" unless WithText says more.
func BoolField(key, name string, b bool) Field {
	return Field{Key: key, Name: name, Value: b, Text: strconv.FormatBool(b)}
}

// TimeField is a moment (key ending _at or _since): an RFC 3339 UTC string for machines,
// HumanTime for people ("2026-12-02 15:08:22").
func TimeField(key, name string, t time.Time) Field {
	return Field{Key: key, Name: name, Value: t.UTC().Format(time.RFC3339), Text: HumanTime(t)}
}

// HumanTime is the one form in which the agent writes a moment for people: the local
// wall clock, to the second ("2026-12-02 15:08:22"), whatever location t carries (a
// record read back is UTC, a fresh clock reading local). Machines get RFC 3339 UTC
// (TimeField's value, --json); nothing written for people mixes the two.
func HumanTime(t time.Time) string { return t.Local().Format(time.DateTime) }

// AgeField is a TimeField whose text also says how long before now it was:
// "2026-12-02 15:08:22 (5m8s ago)".
func AgeField(key, name string, t, now time.Time) Field {
	f := TimeField(key, name, t)
	f.Text += " (" + Age(now.Sub(t)) + " ago)"
	return f
}

// DurationField is a length of time (key ending _seconds): seconds for machines, Go's
// rendering for people, rounded (Duration).
func DurationField(key, name string, d time.Duration) Field {
	return Field{Key: key, Name: name, Value: d.Seconds(), Text: Duration(d).String()}
}

// Duration is d rounded for people, as the agent writes durations everywhere: to the
// millisecond under a second, to a tenth of a second under a minute ("1.1s"), to the
// second under an hour, to the minute above.
func Duration(d time.Duration) time.Duration {
	switch a := d.Abs(); {
	case a < time.Second:
		return d.Round(time.Millisecond)
	case a < time.Minute:
		return d.Round(100 * time.Millisecond)
	case a < time.Hour:
		return d.Round(time.Second)
	}
	return d.Round(time.Minute)
}

// BytesField is a size (key ending _bytes): bytes for machines, binary units for people.
func BytesField(key, name string, n int64) Field {
	return Field{Key: key, Name: name, Value: n, Text: bytesize.Format(n)}
}

// Age renders how long ago something happened for people: seconds under an hour,
// minutes above.
func Age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	if d < time.Hour {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
