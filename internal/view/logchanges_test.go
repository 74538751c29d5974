package view

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

// A diff's changes in the journal: each change its own structured attribute, in the text
// log (no field of escaped quotes) and the JSON log; a sensitive value appears in
// neither, its attribute in both.
func TestLogChanges(t *testing.T) {
	changes := LogChanges{
		{Attr: `env["HF_TOKEN"]`, Old: "hf_old_secret", New: "hf_new_secret", HasOld: true, HasNew: true, Sensitive: true, Effect: agent.Restarts, Reason: agent.ReasonIdentity},
		agent.Set(`flags["mem-fraction-static"]`, 0.85, 0.8).Because(agent.Restarts, agent.ReasonIdentity),
		agent.Added(`flags["tp-size"]`, 2).Because(agent.Restarts, agent.ReasonIdentity),
		agent.Set("argv", agent.CommandLine{"sglang", "--port", "1"}, agent.CommandLine{"sglang", "--port", "2"}).Because(agent.Restarts, agent.ReasonIdentity),
		agent.Removed("pid", agent.Raw("pid 12 is gone")).Because(agent.Restarts, agent.ReasonGone),
		agent.Set("content", strings.Repeat("x", 500), "y"),
	}
	var text bytes.Buffer
	slog.New(slog.NewTextHandler(&text, nil)).Info("applying", "changes", changes)
	for _, want := range []string{
		`changes.env.HF_TOKEN.sensitive=true changes.env.HF_TOKEN.effect=restart changes.env.HF_TOKEN.reason=identity `,
		`changes.flags.mem-fraction-static.old=0.85 changes.flags.mem-fraction-static.new=0.8 changes.flags.mem-fraction-static.effect=restart changes.flags.mem-fraction-static.reason=identity `,
		`changes.flags.tp-size.new=2 changes.flags.tp-size.effect=restart`,
		`changes.argv.differs="~ --port 1 → 2" changes.argv.effect=restart`,
		`changes.pid.old="pid 12 is gone" changes.pid.effect=restart changes.pid.reason=gone`,
		`changes.content.old=` + strings.Repeat("x", maxLogValue) + `… changes.content.new=y changes.content.effect=in-place changes.content.reason=differs`,
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text log:\n%s\nwant it to contain\n%s", text.String(), want)
		}
	}
	if strings.Contains(text.String(), `\"`) {
		t.Errorf("text log has escaped quotes: %s", text.String())
	}
	var js bytes.Buffer
	slog.New(slog.NewJSONHandler(&js, nil)).Info("applying", "changes", changes)
	var rec struct{ Changes map[string]map[string]any }
	if err := json.Unmarshal(js.Bytes(), &rec); err != nil {
		t.Fatalf("JSON log %s: %v", js.String(), err)
	}
	if len(rec.Changes) != len(changes) {
		t.Fatalf("JSON log has %d changes, want %d: %s", len(rec.Changes), len(changes), js.String())
	}
	if c := rec.Changes["env.HF_TOKEN"]; c["sensitive"] != true || c["old"] != nil || c["new"] != nil || c["effect"] != "restart" || c["reason"] != "identity" {
		t.Errorf("sensitive change in JSON = %+v", c)
	}
	if c := rec.Changes["flags.mem-fraction-static"]; c["old"] != 0.85 || c["new"] != 0.8 || c["reason"] != "identity" {
		t.Errorf("flag change in JSON = %+v", c)
	}
	for _, out := range []string{text.String(), js.String()} {
		if strings.Contains(out, "secret") {
			t.Errorf("a sensitive value is in the log: %s", out)
		}
	}
}
