package agent

import (
	"encoding/json"
	"testing"
	"time"
)

// Each constructor gives machines a typed value in the unit its key names and people
// the text the status view printed before fields were typed.
func TestFieldConstructors(t *testing.T) {
	t.Parallel()
	berlin := time.FixedZone("CET", 3600)
	started := time.Date(2026, 12, 2, 15, 8, 22, 0, berlin)
	now := started.Add(5*time.Minute + 8*time.Second)
	// People read the local wall clock, whatever location the time carries (issue 29,
	// point 6): a record read back in UTC and a fresh local reading print alike.
	wall := time.Date(2026, 12, 2, 14, 8, 22, 0, time.UTC).Local().Format(time.DateTime)
	if HumanTime(started) != wall || HumanTime(started.UTC()) != wall {
		t.Errorf("HumanTime: %q and %q, want %q for both", HumanTime(started), HumanTime(started.UTC()), wall)
	}
	for _, c := range []struct {
		f          Field
		json, text string
	}{
		{TextField("log", "log", "/var/log/agent/qwen.2.log"), `"/var/log/agent/qwen.2.log"`, "/var/log/agent/qwen.2.log"},
		{NumberField("pid", "pid", 4242), `4242`, "4242"},
		{NumberField("accept_rate", "accept rate", 0.97), `0.97`, "0.97"},
		{BoolField("ready", "readiness", true).WithText("ready"), `true`, "ready"},
		{TimeField("newest_batch_line_at", "newest batch line", started), `"2026-12-02T14:08:22Z"`, wall},
		{AgeField("started_at", "started", started, now), `"2026-12-02T14:08:22Z"`, wall + " (5m8s ago)"},
		{AgeField("stopped_at", "stopped", started, started.Add(26*time.Hour+31*time.Second)), `"2026-12-02T14:08:22Z"`, wall + " (26h1m0s ago)"},
		{DurationField("next_try_seconds", "next try", 1500*time.Millisecond), `1.5`, "1.5s"},
		{DurationField("start_seconds", "start: total", 1106489514*time.Nanosecond), `1.106489514`, "1.1s"},
		{DurationField("start_ready_seconds", "start: ready", 214908300*time.Nanosecond), `0.2149083`, "215ms"},
		{DurationField("start_weights_loaded_seconds", "start: weights", 190*time.Second+400*time.Millisecond), `190.4`, "3m10s"},
		{BytesField("done_bytes", "bytes", 52<<30), `55834574848`, "52.0 GiB"},
	} {
		b, err := json.Marshal(c.f.Value)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != c.json || c.f.Text != c.text {
			t.Errorf("%s: value %s, text %q; want %s, %q", c.f.Key, b, c.f.Text, c.json, c.text)
		}
	}
}

// Member reads the member field by its key, also from a status that went through JSON
// (agent run's /status read back by agent status).
func TestMemberByKey(t *testing.T) {
	t.Parallel()
	st := &Status{Fields: []Field{TextField("status", "status", "Running"), TextField(MemberField, "member", "kpro5")}}
	b, _ := json.Marshal(st)
	var back Status
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if st.Member() != "kpro5" || back.Member() != "kpro5" {
		t.Errorf("Member() = %q, after JSON %q; want kpro5", st.Member(), back.Member())
	}
	if (&Status{Fields: []Field{TextField("status", "member", "x")}}).Member() != "" {
		t.Error("Member() went by the label, not the key")
	}
}
