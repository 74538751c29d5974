package view

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/docs/schema"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// The diff is typed data: the action is the strongest effect of the changes; the JSON
// view emits the values as JSON values (a mode "0600" once, never "\"0600\""), the human
// view as the plan writes them. Golden: testdata/typed_diff.golden (-update rewrites it).
func TestTypedDiffRendering(t *testing.T) {
	t.Parallel()
	d := (&agent.Diff{}).
		Add(agent.Set("mode", "0644", "0600")).
		Add(agent.Set(`flags["mem-fraction-static"]`, json.Number("0.8"), json.Number("0.85")).Because(agent.Restarts, agent.ReasonIdentity)).
		Add(agent.Added("argv", agent.CommandLine{"python3", "-m", "sglang.launch_server", "--model-path", "/srv/models/Qwen 3", "--tp-size", "2", "--enable-metrics"}).Because(agent.InPlace, agent.ReasonDiffers)).
		Add(agent.Set("running", false, true)).
		Add(agent.Removed("secret", "hunter22").Because(agent.InPlace, agent.ReasonDiffers))
	d.Changes[4].Sensitive = true
	if d.Derive().Action != agent.Restart {
		t.Fatalf("derived %s, want restart", d.Action)
	}
	orphan := (&agent.Diff{}).Add(agent.Removed("process", agent.Raw("pid 12, generation 3")).Because(agent.Deletes, agent.ReasonOrphan)).Derive()
	if orphan.Action != agent.Delete {
		t.Fatalf("derived %s, want delete", orphan.Action)
	}
	relaunch := (&agent.Diff{}).Add(agent.Set("argv",
		agent.CommandLine{"/opt/sglang/bin/sglang", "serve", "--mem-fraction-static", "0.85", "--tp-size=2", "--log-level", "info", "--enable-metrics"},
		agent.CommandLine{"/opt/sglang/bin/sglang", "serve", "--mem-fraction-static", "0.8", "--tp-size=2", "--served-model-name", "it's", "--enable-metrics"},
	).Because(agent.Restarts, agent.ReasonIdentity)).Derive()
	rep := &agent.Report{Steps: []*agent.Step{{Addr: "server.old", Diff: orphan, Orphan: true}, {Addr: "server.qwen", Diff: d}, {Addr: "server.tuned", Diff: relaunch}}}
	var human, js bytes.Buffer
	(&View{W: &human}).Plan(rep)
	if err := WriteJSON(&js, JSON("plan", rep, NewRedactor([]string{"hunter22"}))); err != nil {
		t.Fatal(err)
	}
	if err := schema.Validate(js.Bytes()); err != nil {
		t.Errorf("the document breaks %s: %v", schema.OutputV3Name, err)
	}
	got := human.String() + "\n" + js.String()
	golden := filepath.Join("testdata", "typed_diff.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("rendering differs from %s:\n%s", golden, got)
	}
	if strings.Contains(got, `\"0600\"`) || strings.Contains(got, "hunter22") {
		t.Error("a value was encoded twice, or a secret printed")
	}
}

// The plan shows each rollout group with disruptions on its own line, and --json lists
// every group (one without disruptions too).
func TestPlanRolloutLines(t *testing.T) {
	t.Parallel()
	rep := &agent.Report{Rollouts: []agent.RolloutSummary{
		{Group: "qwen", MaxUnavailable: 1, Members: 3, Disruptions: agent.Summary{Restart: 2}, Down: []string{"member.c"}},
		{Group: "idle", MaxUnavailable: 1, Members: 2, Down: []string{}},
	}}
	var out bytes.Buffer
	(&View{W: &out}).Plan(rep)
	want := "  rollout qwen: 2 restarts, 1 at a time; member.c down (repaired first, counted as unavailable)\n"
	if !strings.HasPrefix(out.String(), want) || strings.Contains(out.String(), "idle") {
		t.Errorf("plan output:\n%s\nwant the line %q and no line of idle", out.String(), want)
	}
	doc := JSON("plan", rep, nil)
	if len(doc.Rollouts) != 2 || doc.Rollouts[0].Disruptions.Restart != 2 || doc.Rollouts[1].Group != "idle" {
		t.Errorf("--json rollouts: %+v", doc.Rollouts)
	}
}
