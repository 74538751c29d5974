package view

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

// Issue 27, point 8: a newline (or any control character) in a value printed by a human
// view is escaped, so that a flag value cannot forge a line of `agent plan` (nor an ESC
// sequence move the cursor): the plan's command lines, plain values, warnings, errors
// and status fields.
func TestHumanViewsEscapeControlCharacters(t *testing.T) {
	forged := "qwen\n      + --forged-flag 1\x1b[2K"
	rep := &agent.Report{Steps: []*agent.Step{
		{Addr: "server.qwen", Diff: (&agent.Diff{Action: agent.Create, Warnings: []string{"log says: x\n  ! fake warning"}}).
			Add(agent.Added("argv", agent.CommandLine{"/usr/bin/sglang", "--served-model-name", forged})).
			Add(agent.Added("note", agent.Raw("raw\nsentence")))},
		{Addr: "file.a", Err: errors.New("file.a: read: bad\n  ✓ file.b: fine")},
	}}
	var plan bytes.Buffer
	(&View{W: &plan, Redact: NewRedactor(nil)}).Plan(rep)
	var status bytes.Buffer
	(&View{W: &status, Redact: NewRedactor(nil)}).Status(&agent.Report{Steps: []*agent.Step{
		{Addr: "server.qwen", Status: &agent.Status{Healthy: true, Summary: "running\n  ✓ server.fake: running",
			Fields: []agent.Field{agent.TextField("log", "log", "quote\nforged: line")}}},
	}})
	for name, out := range map[string]string{"plan": plan.String(), "status": status.String()} {
		if strings.Contains(out, "\x1b") {
			t.Errorf("%s: an ESC reached the terminal:\n%q", name, out)
		}
		for _, line := range strings.Split(out, "\n") {
			l := strings.TrimSpace(line)
			if strings.HasPrefix(l, "+ --forged") || strings.HasPrefix(l, "! fake") || strings.HasPrefix(l, "✓ file.b") ||
				strings.HasPrefix(l, "✓ server.fake") || strings.HasPrefix(l, "forged:") || l == "sentence" {
				t.Errorf("%s: a value forged the line %q:\n%s", name, line, out)
			}
		}
	}
	if !strings.Contains(plan.String(), `--served-model-name $'qwen\n      + --forged-flag 1\x1b[2K'`) {
		t.Errorf("the flag value is not ANSI-C quoted on its line:\n%s", plan.String())
	}
}

// Issue 35, point 3: multi-line text (a log tail, an error quoting a traceback) is
// printed as indented lines behind a gutter, each line escaped on its own: readable, and
// still no line of it passes for a line of the view nor moves the cursor. --json keeps
// the strings as they are.
func TestMultiLineTextIsPrintedAsLines(t *testing.T) {
	tail := "Traceback (most recent call last):\n  File \"x.py\", line 1\ntorch.OutOfMemoryError: CUDA out of memory\x1b[2K\n  ✓ server.fake: running"
	rep := &agent.Report{Steps: []*agent.Step{
		{Addr: "server.qwen", Status: &agent.Status{Summary: "degraded",
			Fields: []agent.Field{agent.TextField("log_tail", "log tail", tail), agent.TextField("pid", "pid", "4711")}}},
		{Addr: "file.a", Err: errors.New("file.a: launch failed; last 2 lines of its log:\n    first\n    second\ttab")},
	}}
	var out bytes.Buffer
	(&View{W: &out, Redact: NewRedactor(nil)}).Status(rep)
	want := "" +
		"  ! server.qwen: degraded\n" +
		"      log tail  Traceback (most recent call last):\n" +
		"                │   File \"x.py\", line 1\n" +
		"                │ torch.OutOfMemoryError: CUDA out of memory\\x1b[2K\n" +
		"                │   ✓ server.fake: running\n" +
		"      pid       4711\n" +
		"  ✗ file.a: launch failed; last 2 lines of its log:\n" +
		"      │     first\n" +
		"      │     second\\ttab\n"
	if out.String() != want {
		t.Errorf("status:\n%s\nwant:\n%s", out.String(), want)
	}
	doc := JSON("status", rep, NewRedactor(nil))
	if got := doc.Resources[0].Status.Fields[0].Text; got != tail {
		t.Errorf("--json changed the log tail: %q", got)
	}
}
