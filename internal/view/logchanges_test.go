package view

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

// A diff's changes in the journal: the text log reads one line, the JSON log a list of
// --json's change objects; a sensitive value appears in neither, its attribute in both.
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
	want := `changes="env[\"HF_TOKEN\"] (sensitive value) (restart: identity changed); ` +
		`flags[\"mem-fraction-static\"]: 0.85 → 0.8 (restart: identity changed); ` +
		`flags[\"tp-size\"]: none → 2 (restart: identity changed); ` +
		`argv: ~ --port 1 → 2 (restart: identity changed); ` +
		`pid: pid 12 is gone → none (restart: gone); ` +
		`content: \"` + strings.Repeat("x", maxLogValue-1) + `… → \"y\" (in-place: differs from the plan)"`
	if !strings.Contains(text.String(), want) {
		t.Errorf("text log:\n%s\nwant it to contain\n%s", text.String(), want)
	}
	var js bytes.Buffer
	slog.New(slog.NewJSONHandler(&js, nil)).Info("applying", "changes", changes)
	var rec struct{ Changes []JSONChange }
	if err := json.Unmarshal(js.Bytes(), &rec); err != nil {
		t.Fatalf("JSON log %s: %v", js.String(), err)
	}
	if len(rec.Changes) != len(changes) {
		t.Fatalf("JSON log has %d changes, want %d: %s", len(rec.Changes), len(changes), js.String())
	}
	if c := rec.Changes[0]; c.Attribute != `env["HF_TOKEN"]` || !c.Sensitive || c.Old != nil || c.New != nil || c.Effect != agent.Restarts || c.Reason != agent.ReasonIdentity {
		t.Errorf("sensitive change in JSON = %+v", c)
	}
	if c := rec.Changes[1]; c.Old != 0.85 || c.New != 0.8 || c.Reason != agent.ReasonIdentity {
		t.Errorf("flag change in JSON = %+v", c)
	}
	for _, out := range []string{text.String(), js.String()} {
		if strings.Contains(out, "secret") {
			t.Errorf("a sensitive value is in the log: %s", out)
		}
	}
}
