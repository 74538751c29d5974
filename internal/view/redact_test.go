package view

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
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
