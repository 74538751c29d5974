package view

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

func TestRedactingHandler(t *testing.T) {
	t.Parallel()
	const secret = "hf_SuperSecretValue"
	var buf bytes.Buffer
	h := NewRedactingHandler(slog.NewTextHandler(&buf, nil), nil)
	log := slog.New(h)
	log.Info("before a plan: nothing is known to redact", "v", "plain")

	h.SetRedactor(NewRedactor([]string{secret}))
	derived := log.With("resource", "download.qwen", "url", "https://hub/x?token="+secret)
	derived.Error("resource failed: "+secret,
		"error", errors.New("GET https://hub/x?token="+secret+": 403"),
		"flags", []string{"--api-key", secret},
		slog.Group("req", "auth", "Bearer "+secret),
		"n", 3)
	out := buf.String()
	if strings.Contains(out, secret) {
		t.Errorf("a secret reached the log:\n%s", out)
	}
	for _, want := range []string{"v=plain", "resource=download.qwen", `url="https://hub/x?token=(sensitive)"`,
		`msg="resource failed: (sensitive)"`, `error="GET https://hub/x?token=(sensitive): 403"`,
		`flags="[--api-key (sensitive)]"`, `req.auth="Bearer (sensitive)"`, "n=3"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
}

// The engine logs a diff's changes as data ([]agent.Change); the handler writes them as
// LogChanges: one line in a text log, --json's change objects in a JSON log, with or
// without secrets to redact.
func TestRedactingHandlerRendersChanges(t *testing.T) {
	t.Parallel()
	changes := []agent.Change{agent.Set(`flags["port"]`, 30000, 30001).Because(agent.Restarts, agent.ReasonIdentity)}
	for _, r := range []*Redactor{nil, NewRedactor([]string{"hf_secret"})} {
		var text, js bytes.Buffer
		slog.New(NewRedactingHandler(slog.NewTextHandler(&text, nil), r)).Info("applying", "changes", changes)
		if want := `changes="flags[\"port\"]: 30000 → 30001 (restart: identity changed)"`; !strings.Contains(text.String(), want) {
			t.Errorf("text log %s\nwant %s", text.String(), want)
		}
		slog.New(NewRedactingHandler(slog.NewJSONHandler(&js, nil), r)).Info("applying", "changes", changes)
		if want := `"changes":[{"attribute":"flags[\"port\"]","old":30000,"new":30001,"sensitive":false,"effect":"restart","reason":"identity","note":"","text":""}]`; !strings.Contains(js.String(), want) {
			t.Errorf("JSON log %s\nwant %s", js.String(), want)
		}
	}
}
