package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
)

// documents are valid documents of every command, built by the code the binary prints
// them with (view.JSON and its constructors), each with what the schema constrains:
// typed changes, a sensitive one, status fields of every value type, a failed and a
// skipped resource, a diagnostic, a rollout group.
func documents(t *testing.T) map[string][]byte {
	t.Helper()
	now := time.Date(2026, 12, 2, 15, 13, 30, 0, time.UTC)
	started := now.Add(-5*time.Minute - 8*time.Second)
	plan := (&agent.Diff{}).
		Add(agent.Set("mode", "0644", "0600")).
		Add(agent.Set(`flags["tp-size"]`, 1, 2).Because(agent.Restarts, agent.ReasonIdentity)).
		Add(agent.Added("argv", agent.CommandLine{"sglang", "serve", "--tp-size", "2"}).Because(agent.InPlace, agent.ReasonDiffers)).
		Add(agent.Removed("secret", "hunter22").Because(agent.InPlace, agent.ReasonDiffers))
	plan.Changes[3].Sensitive = true
	plan.Warnings = []string{"a warning"}
	plan.Derive()
	status := &agent.Status{Healthy: true, Summary: "running, ready, generation 2", Metrics: map[string]float64{"up": 1}, Fields: []agent.Field{
		agent.NumberField("pid", "pid", 4242),
		agent.AgeField("started_at", "started", started, now),
		agent.NumberField("generation", "generation", 2).WithText("2 (adopted: not launched by this agent)"),
		agent.TextField("log", "log", "/var/log/agent/qwen.2.log"),
		agent.BoolField("ready", "readiness", true).WithText("ready"),
		agent.NumberField("accept_rate", "accept rate", 0.97).WithText("0.97"),
		agent.DurationField("next_try_seconds", "next try", 1500*time.Millisecond),
		agent.BytesField(`done_bytes["model.safetensors"]`, "file model.safetensors", 52<<30),
		agent.TextField("gpu[0]", "gpu 0", "NVIDIA RTX A6000"),
	}, Faults: []agent.Fault{{At: now, Subject: "gpu[1]", Device: "0000:41:00.0", Kind: gpu.FaultXid, Code: 79, Action: gpu.ActionReboot.String(),
		Text: "GPU has fallen off the bus.", Line: "NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}}}
	failed := &agent.Step{Addr: "file.motd", Err: errors.New("file.motd: permission denied")}
	steps := func(command string) *agent.Report {
		rep := &agent.Report{Steps: []*agent.Step{
			{Addr: "server.qwen", Diff: plan, Duration: 12 * time.Millisecond, MovedFrom: "server.qwen_a", Applied: command != "plan", Status: status},
			failed,
		}}
		if command == "plan" {
			// An orphan deleted only after what its weights serve is verified (issue 35).
			rep.Steps = append(rep.Steps, &agent.Step{Addr: "download.m1", Orphan: true, DeletedAfter: []string{"server.qwen"},
				Diff: (&agent.Diff{}).Add(agent.Removed("dest", "/models/m1").Because(agent.Deletes, agent.ReasonOrphan)).Derive()})
			rep.Rollouts = []agent.RolloutSummary{{Group: "qwen", MaxUnavailable: 1, Members: 2, Down: []string{}}}
		}
		return rep
	}
	red := view.NewRedactor([]string{"hunter22"})
	docs := map[string]*view.JSONOutput{}
	for _, c := range []string{"plan", "apply", "destroy", "status"} {
		docs[c] = view.JSON(c, steps(c), red)
	}
	docs["status from agent run"] = view.JSON("status", steps("status"), red)
	docs["status from agent run"].StateDir = "/var/lib/agent"
	docs["validate"] = view.DiagnosticsJSON("validate", nil)
	docs["plan, invalid"] = view.DiagnosticsJSON("plan", []plans.JSONDiagnostic{{Severity: "error", Summary: "Unsupported argument",
		Range: &plans.JSONRange{Filename: "plan.hcl", Start: plans.JSONPos{Line: 3, Column: 3}, End: plans.JSONPos{Line: 3, Column: 8}}}})
	docs["apply, lock held"] = view.ErrorJSON("apply", "locked by PID 77 since 2026-12-02T15:08:22Z")
	out := map[string][]byte{}
	since := now.Add(-40 * time.Second)
	fl := fleet.NewDocument(&fleet.Status{Prefix: "/agent/prod", Hosts: []fleet.HostStatus{
		{Host: "kpro5", Reachable: true, Updated: now, Summary: &fleet.Summary{Host: "kpro5", Version: "1.0", Healthy: false,
			Resources: []fleet.ResourceSummary{{Address: "server.qwen", Summary: "not converged", Error: "rollout qwen: waiting"}},
			Rollouts:  []fleet.InFlight{{Group: "qwen", Member: "server.qwen", Action: "restart", Since: since, Failed: ""}}}},
		{Host: "kpro6", Reachable: false, Updated: since, Summary: nil},
	}, Rollouts: []coord.Group{{Name: "qwen", Permits: []coord.Permit{{Group: "qwen", Host: "kpro5", Member: "server.qwen", State: coord.Disrupting, Action: "restart", Since: since, Revision: 812}},
		Stop: &coord.Stop{Group: "qwen", Host: "kpro7", Member: "server.qwen", Reason: "exited: CUDA out of memory", Since: since}}},
		HostPermits: []coord.HostPermit{{Group: "gpu-hosts", Host: "kpro6", Cause: "driver", Detail: "driver 580.95.05 → 590.48.01", State: coord.HostRebooting,
			BootID: "b1", RebootID: "b1", Since: since, Updated: since, Members: map[string][]string{"qwen": {"server.qwen"}}, Revision: 815},
			{Group: "gpu-hosts", Host: "kpro7", Cause: "driver", Detail: "driver 580.95.05 → 590.48.01", State: coord.HostFailed, BootID: "b2", Since: since, Updated: now,
				Failure: &coord.HostFailure{Step: coord.StepInstall, Error: "installer failed: exit status 1", At: now, BootID: "b2"}, Revision: 820}}})
	var fb bytes.Buffer
	if err := view.WriteJSON(&fb, fl); err != nil {
		t.Fatal(err)
	}
	out["status --fleet"] = fb.Bytes()
	for name, d := range docs {
		var b bytes.Buffer
		if err := view.WriteJSON(&b, d); err != nil {
			t.Fatal(err)
		}
		out[name] = b.Bytes()
	}
	return out
}

func TestDocumentsOfEveryCommandAreValid(t *testing.T) {
	t.Parallel()
	for name, doc := range documents(t) {
		if err := Validate(doc); err != nil {
			t.Errorf("%s: %v\n%s", name, err, doc)
		}
	}
}

// The schema refuses what breaks the contract, so a check against it cannot pass by
// accepting everything: each mutation of a valid document must be refused.
func TestSchemaRefusesWrongDocuments(t *testing.T) {
	t.Parallel()
	docs := documents(t)
	type mutation struct {
		name string
		doc  string // key in docs
		edit func(d map[string]any)
	}
	res := func(d map[string]any) map[string]any { return d["resources"].([]any)[0].(map[string]any) }
	change := func(d map[string]any, i int) map[string]any { return res(d)["changes"].([]any)[i].(map[string]any) }
	field := func(d map[string]any, key string) map[string]any {
		for _, f := range res(d)["status"].(map[string]any)["fields"].([]any) {
			if f := f.(map[string]any); f["key"] == key {
				return f
			}
		}
		panic("no field " + key)
	}
	for _, m := range []mutation{
		{"old format_version", "plan", func(d map[string]any) { d["format_version"] = "2" }},
		{"status without faults", "status", func(d map[string]any) { delete(res(d)["status"].(map[string]any), "faults") }},
		{"a fault asking for an unknown action", "status", func(d map[string]any) {
			res(d)["status"].(map[string]any)["faults"].([]any)[0].(map[string]any)["action"] = "pray"
		}},
		{"a fault without its line", "status", func(d map[string]any) {
			delete(res(d)["status"].(map[string]any)["faults"].([]any)[0].(map[string]any), "line")
		}},
		{"unknown command", "plan", func(d map[string]any) { d["command"] = "export" }},
		{"extra top-level field", "plan", func(d map[string]any) { d["extra"] = 1 }},
		{"missing error", "plan", func(d map[string]any) { delete(d, "error") }},
		{"missing diagnostics", "validate", func(d map[string]any) { delete(d, "diagnostics") }},
		{"missing resources", "apply, lock held", func(d map[string]any) { delete(d, "resources") }},
		{"ok as a string", "plan", func(d map[string]any) { d["ok"] = "true" }},
		{"plan without summary", "plan", func(d map[string]any) { delete(d, "summary") }},
		{"status with a summary", "status", func(d map[string]any) { d["summary"] = map[string]any{} }},
		{"summary count as a string", "apply", func(d map[string]any) { d["summary"].(map[string]any)["create"] = "1" }},
		{"plan without rollouts", "plan", func(d map[string]any) { delete(d, "rollouts") }},
		{"state_dir outside status", "plan", func(d map[string]any) { d["state_dir"] = "/var/lib/agent" }},
		{"an error with ok", "apply, lock held", func(d map[string]any) { d["ok"] = true }},
		{"missing warnings", "plan", func(d map[string]any) { delete(res(d), "warnings") }},
		{"missing resource error", "plan", func(d map[string]any) { delete(res(d), "error") }},
		{"missing changes", "status", func(d map[string]any) { delete(res(d), "changes") }},
		{"duration as a string", "plan", func(d map[string]any) { res(d)["duration_ms"] = "12" }},
		{"unknown action", "plan", func(d map[string]any) { res(d)["action"] = "recreate" }},
		{"extra resource field", "plan", func(d map[string]any) { res(d)["extra"] = true }},
		{"applied in a plan", "plan", func(d map[string]any) { res(d)["applied"] = false }},
		{"apply without applied", "apply", func(d map[string]any) { delete(res(d), "applied") }},
		{"destroy without applied", "destroy", func(d map[string]any) { delete(res(d), "applied") }},
		{"finished in a plan", "plan", func(d map[string]any) { res(d)["finished"] = "" }},
		{"apply without finished", "apply", func(d map[string]any) { delete(res(d), "finished") }},
		{"finished not a string", "apply", func(d map[string]any) { res(d)["finished"] = true }},
		{"status without status", "status", func(d map[string]any) { delete(res(d), "status") }},
		{"null status", "status", func(d map[string]any) { res(d)["status"] = nil }},
		{"unknown effect", "plan", func(d map[string]any) { change(d, 0)["effect"] = "destroy" }},
		{"unknown reason", "plan", func(d map[string]any) { change(d, 0)["reason"] = "because" }},
		{"double-encoded value", "plan", func(d map[string]any) { change(d, 0)["new"] = `"0600"` }},
		{"sensitive change with a value", "plan", func(d map[string]any) { change(d, 3)["old"] = "x" }},
		{"missing note", "plan", func(d map[string]any) { delete(change(d, 0), "note") }},
		{"status without fields", "status", func(d map[string]any) { delete(res(d)["status"].(map[string]any), "fields") }},
		{"status without metrics", "status", func(d map[string]any) { delete(res(d)["status"].(map[string]any), "metrics") }},
		{"metric as a string", "status", func(d map[string]any) { res(d)["status"].(map[string]any)["metrics"].(map[string]any)["up"] = "1" }},
		{"field without text", "status", func(d map[string]any) { delete(field(d, "pid"), "text") }},
		{"field without key", "status", func(d map[string]any) { delete(field(d, "pid"), "key") }},
		{"field key not snake_case", "status", func(d map[string]any) { field(d, "log")["key"] = "Log File" }},
		{"field value a list", "status", func(d map[string]any) { field(d, "log")["value"] = []any{"a"} }},
		{"pid as a string", "status", func(d map[string]any) { field(d, "pid")["value"] = "4242" }},
		{"time for people", "status", func(d map[string]any) { field(d, "started_at")["value"] = "2026-12-02 15:08:22 (5m8s ago)" }},
		{"time not in UTC", "status", func(d map[string]any) { field(d, "started_at")["value"] = "2026-12-02T16:08:22+01:00" }},
		{"duration as text", "status", func(d map[string]any) { field(d, "next_try_seconds")["value"] = "1.5s" }},
		{"bytes as text", "status", func(d map[string]any) { field(d, `done_bytes["model.safetensors"]`)["value"] = "52.0 GiB" }},
		{"diagnostic without range lines", "plan, invalid", func(d map[string]any) {
			delete(d["diagnostics"].([]any)[0].(map[string]any)["range"].(map[string]any), "start")
		}},
		{"fleet outside status", "status --fleet", func(d map[string]any) {
			d["command"] = "plan"
			d["summary"] = map[string]any{}
			d["rollouts"] = []any{}
		}},
		{"fleet with resources", "status --fleet", func(d map[string]any) { d["resources"] = docsResources(docs) }},
		{"fleet host without reachable", "status --fleet", func(d map[string]any) {
			delete(d["fleet"].(map[string]any)["hosts"].([]any)[0].(map[string]any), "reachable")
		}},
		{"fleet permit of an unknown state", "status --fleet", func(d map[string]any) {
			d["fleet"].(map[string]any)["rollouts"].([]any)[0].(map[string]any)["permits"].([]any)[0].(map[string]any)["state"] = "held"
		}},
		{"fleet group without stopped", "status --fleet", func(d map[string]any) {
			delete(d["fleet"].(map[string]any)["rollouts"].([]any)[0].(map[string]any), "stopped")
		}},
		{"host permit failure of an unknown step", "status --fleet", func(d map[string]any) {
			d["fleet"].(map[string]any)["host_permits"].([]any)[1].(map[string]any)["failure"].(map[string]any)["step"] = "upgrade"
		}},
		{"host permit failure without its error", "status --fleet", func(d map[string]any) {
			delete(d["fleet"].(map[string]any)["host_permits"].([]any)[1].(map[string]any)["failure"].(map[string]any), "error")
		}},
		{"unknown severity", "plan, invalid", func(d map[string]any) { d["diagnostics"].([]any)[0].(map[string]any)["severity"] = "fatal" }},
	} {
		var d map[string]any
		if err := json.Unmarshal(docs[m.doc], &d); err != nil {
			t.Fatalf("%s: %v", m.doc, err)
		}
		if same, _ := json.Marshal(d); Validate(same) != nil {
			t.Fatalf("%s: refused before any mutation: %v", m.doc, Validate(same))
		}
		m.edit(d)
		b, _ := json.Marshal(d)
		if err := Validate(b); err == nil {
			t.Errorf("%s (%s): the schema accepted\n%s", m.name, m.doc, b)
		}
	}
}

// docsResources are the resources of the status document.
func docsResources(docs map[string][]byte) []any {
	var d map[string]any
	json.Unmarshal(docs["status"], &d)
	return d["resources"].([]any)
}

// Every document of the table is the whole contract: the enums of the schema are the
// engine's own sets, so a new action, effect or reason cannot reach output unannounced.
func TestSchemaEnumsAreTheEngines(t *testing.T) {
	t.Parallel()
	var s struct {
		Defs map[string]struct {
			Enum []string `json:"enum"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(OutputV3, &s); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, r := range agent.Reasons {
		reasons = append(reasons, string(r))
	}
	for def, want := range map[string][]string{
		"action": {"", string(agent.NoOp), string(agent.Adopt), string(agent.Create), string(agent.Update), string(agent.Restart), string(agent.Replace), string(agent.Delete)},
		"effect": {string(agent.Adopts), string(agent.InPlace), string(agent.Creates), string(agent.Restarts), string(agent.Replaces), string(agent.Deletes)},
		"reason": reasons,
	} {
		if got := s.Defs[def].Enum; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("$defs.%s.enum = %q, want %q", def, got, want)
		}
	}
	var f struct {
		Defs struct {
			Fault struct {
				Properties map[string]struct {
					Enum []string `json:"enum"`
				} `json:"properties"`
			} `json:"fault"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(OutputV3, &f); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for a := gpu.ActionIgnore; a <= gpu.ActionReboot; a++ {
		actions = append(actions, a.String())
	}
	if got := f.Defs.Fault.Properties["action"].Enum; fmt.Sprint(got) != fmt.Sprint(actions) {
		t.Errorf("$defs.fault.action.enum = %q, want %q", got, actions)
	}
	if got := f.Defs.Fault.Properties["kind"].Enum; fmt.Sprint(got) != fmt.Sprint(gpu.FaultKinds) {
		t.Errorf("$defs.fault.kind.enum = %q, want %q", got, gpu.FaultKinds)
	}
	var h struct {
		Defs map[string]struct {
			Properties map[string]struct {
				Enum []string `json:"enum"`
			} `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(OutputV3, &h); err != nil {
		t.Fatal(err)
	}
	if got, want := h.Defs["fleet_host_permit"].Properties["state"].Enum, append(slices.Clone(coord.HostStates), "unreadable"); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("$defs.fleet_host_permit.state.enum = %q, want %q", got, want)
	}
	if got := h.Defs["fleet_host_failure"].Properties["step"].Enum; fmt.Sprint(got) != fmt.Sprint(coord.HostSteps) {
		t.Errorf("$defs.fleet_host_failure.step.enum = %q, want %q", got, coord.HostSteps)
	}
	if !strings.Contains(string(OutputV3), `"format_version": { "const": `+strconv.Quote(view.FormatVersion)+` }`) {
		t.Errorf("the schema is not the one of format_version %q", view.FormatVersion)
	}
}

// The validator is for tests: the agent binary does not link it (nor this package).
func TestBinaryDoesNotLinkTheValidator(t *testing.T) {
	t.Parallel()
	// go test runs with the go command at hand: go list failing is a failure, never a skip.
	out, err := exec.Command("go", "list", "-deps", "github.com/agent-dev/agent").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "jsonschema") || pkg == "github.com/agent-dev/agent/docs/schema" {
			t.Errorf("the binary links %s", pkg)
		}
	}
}
