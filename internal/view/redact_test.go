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
// LogChanges: each change its own structured attributes, in a text log and a JSON log,
// with or without secrets to redact (a secret inside a change's value is redacted too).
func TestRedactingHandlerRendersChanges(t *testing.T) {
	t.Parallel()
	changes := []agent.Change{
		agent.Set(`flags["port"]`, 30000, 30001).Because(agent.Restarts, agent.ReasonIdentity),
		agent.Set("url", "https://hub/x?token=hf_secret", "https://hub/y").Because(agent.Restarts, agent.ReasonIdentity),
	}
	for _, r := range []*Redactor{nil, NewRedactor([]string{"hf_secret"})} {
		var text, js bytes.Buffer
		slog.New(NewRedactingHandler(slog.NewTextHandler(&text, nil), r)).Info("applying", "changes", changes)
		if want := `changes.flags.port.old=30000 changes.flags.port.new=30001 changes.flags.port.effect=restart changes.flags.port.reason=identity`; !strings.Contains(text.String(), want) {
			t.Errorf("text log %s\nwant %s", text.String(), want)
		}
		slog.New(NewRedactingHandler(slog.NewJSONHandler(&js, nil), r)).Info("applying", "changes", changes)
		if want := `"flags.port":{"old":30000,"new":30001,"effect":"restart","reason":"identity"}`; !strings.Contains(js.String(), want) {
			t.Errorf("JSON log %s\nwant %s", js.String(), want)
		}
		if r != nil && strings.Contains(text.String()+js.String(), "hf_secret") {
			t.Errorf("a secret in a change's value reached the log:\n%s\n%s", text.String(), js.String())
		}
	}
}
