package gpu

import (
	"strings"
	"testing"
)

// Every state has its own name and its own one-line message, and the name
// round-trips through MarshalText/UnmarshalText.
func TestStateNamesAndMessages(t *testing.T) {
	t.Parallel()
	names := map[string]State{}
	messages := map[string]State{}
	for s := StateUnknown; s <= StateError; s++ {
		name, msg := s.String(), s.Message()
		if name == "" || msg == "" || strings.Contains(msg, "\n") {
			t.Errorf("state %d: name %q, message %q: want both non-empty, message on one line", int(s), name, msg)
		}
		if prev, dup := names[name]; dup {
			t.Errorf("states %d and %d share the name %q", int(prev), int(s), name)
		}
		if prev, dup := messages[msg]; dup {
			t.Errorf("states %d and %d share the message %q", int(prev), int(s), msg)
		}
		names[name], messages[msg] = s, s

		text, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back State
		if err := back.UnmarshalText(text); err != nil || back != s {
			t.Errorf("round trip of %v: got %v, %v", s, back, err)
		}
	}
	if got := State(99).String(); got != "State(99)" {
		t.Errorf("State(99).String() = %q", got)
	}
	if _, err := State(99).MarshalText(); err == nil {
		t.Error("State(99).MarshalText: want an error")
	}
	var s State
	if err := s.UnmarshalText([]byte("sideways")); err == nil {
		t.Error(`UnmarshalText("sideways"): want an error`)
	}
}

// The messages tell the operator the fix, not only the symptom.
func TestStateMessagesNameTheFix(t *testing.T) {
	t.Parallel()
	for s, want := range map[State]string{
		StateNoLibrary:       "install",
		StateNoDriver:        "modprobe nvidia",
		StateNoGPU:           "lspci",
		StateNoPermission:    "root",
		StateVersionMismatch: "reboot, or reload the nvidia modules",
		StateError:           "dmesg",
	} {
		if !strings.Contains(s.Message(), want) {
			t.Errorf("%v.Message() = %q, want it to mention %q", s, s.Message(), want)
		}
	}
}
