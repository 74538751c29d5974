package view

import (
	"errors"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

// TestStatusViewMembers: resources that name a cluster member are listed under it with
// their health, after the per-resource lines; a plan without members prints no section.
func TestStatusViewMembers(t *testing.T) {
	member := func(m string) []agent.Field {
		return []agent.Field{agent.TextField("status", "status", "Running"), agent.TextField(agent.MemberField, "member", m)}
	}
	rep := &agent.Report{Steps: []*agent.Step{
		{Addr: "container.a", Status: &agent.Status{Healthy: true, Summary: "running", Fields: member("m2")}},
		{Addr: "server.qa", Status: &agent.Status{Healthy: false, Summary: "not ready", Fields: member("m2")}},
		{Addr: "container.b", Status: &agent.Status{Healthy: true, Summary: "running", Fields: member("m1")}},
		{Addr: "file.x", Status: &agent.Status{Healthy: true, Summary: "ok"}},
		{Addr: "container.gone", Err: errors.New("boom")},
	}}
	var b strings.Builder
	(&View{W: &b}).Status(rep)
	out := b.String()
	want := "\nMembers:\n  m1: ✓ container.b\n  m2: ✓ container.a, ! server.qa\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("status view ends with\n%s\nwant\n%s", out, want)
	}
	b.Reset()
	(&View{W: &b}).Status(&agent.Report{Steps: rep.Steps[3:4]})
	if strings.Contains(b.String(), "Members") {
		t.Errorf("a plan without members printed a members section:\n%s", b.String())
	}
}
