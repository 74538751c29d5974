package server

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// sensitivePlan is the server of testdata/records/server-sensitive-d14b7a6.json: one
// secret among the env variables and one among the flags. tok and key rotate the secrets,
// cuda changes a variable that is not one.
const sensitivePlan = `
variable "tok" {
  default   = "hf_secret_one"
  sensitive = true
}
variable "key" {
  default   = "sk-api-key-one"
  sensitive = true
}
variable "cuda" { default = "0,1" }
server "qwen" {
  command = ["/opt/sglang/bin/python3", "-m", "sglang.launch_server"]
  flags = {
    "model-path"          = "/models/qwen"
    "port"                = 30000
    "mem-fraction-static" = 0.85
    "api-key"             = var.key
    "enable-metrics"      = true
  }
  env  = { HF_TOKEN = var.tok, CUDA_VISIBLE_DEVICES = var.cuda }
  port = 30000
}
`

func sensitiveServer(t *testing.T, vars ...string) *Server {
	t.Helper()
	p := restest.LoadPlan(t, t.TempDir(), sensitivePlan, kindsFor(resources.Machine{}), vars...)
	rs, diags := agent.Bind(p, kindsFor(resources.Machine{}))
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	return rs["server.qwen"].(*Server)
}

// legacyRecord is a server record as the agent of commit d14b7a6 wrote it for
// sensitivePlan, before sensitivity was per key: one secret in env or flags made it
// digest every value of that map (and the argv). The file was written by that code and is
// never regenerated.
func legacyRecord(t *testing.T) serverRecord {
	t.Helper()
	b, err := os.ReadFile("testdata/records/server-sensitive-d14b7a6.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec serverRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// Upgrading the agent relaunches nothing: a record written before per-key sensitivity
// (every env and flag value digested) matches the same plan, which records only the
// secrets as digests from now on; a rotated secret is still a restart whose reason is
// the identity and which names that key alone.
func TestSensitiveRecordFromBeforePerKeyIsNoOp(t *testing.T) {
	t.Parallel()
	rec := legacyRecord(t)
	if got := sensitiveServer(t).identityChanges(&rec); len(got) != 0 {
		t.Fatalf("the record of the previous agent differs from the same plan (every server would relaunch on upgrade): %+v", got)
	}

	for _, tt := range []struct {
		vars []string
		want []agent.Change
	}{
		{[]string{"tok=hf_secret_two"}, []agent.Change{{Attr: `env["HF_TOKEN"]`, Old: agent.Raw("(sensitive)"), New: "hf_secret_two", HasOld: true, HasNew: true, Sensitive: true}}},
		{[]string{"key=sk-api-key-two"}, []agent.Change{{Attr: `flags["api-key"]`, Old: agent.Raw("(sensitive)"), New: "sk-api-key-two", HasOld: true, HasNew: true, Sensitive: true}}},
		// A variable that is not a secret: its new value is shown (the old one was
		// recorded as a digest by the previous agent and is not known).
		{[]string{"cuda=0"}, []agent.Change{{Attr: `env["CUDA_VISIBLE_DEVICES"]`, Old: agent.Raw("(sensitive)"), New: "0", HasOld: true, HasNew: true}}},
	} {
		got := sensitiveServer(t, tt.vars...).identityChanges(&rec)
		for i := range got {
			if got[i].Effect != agent.Restarts || got[i].Reason != agent.ReasonIdentity {
				t.Errorf("%v: %s is %s because %s, want a restart because of the identity", tt.vars, got[i].Attr, got[i].Effect, got[i].Reason)
			}
			got[i].Effect, got[i].Reason = "", ""
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%v: changes (-want +got):\n%s", tt.vars, diff)
		}
	}
}

// From now on only the secrets are recorded as digests; the other values are kept as
// they are, and a changed one is shown with its old and new value.
func TestSensitiveRecordDigestsOnlyTheSecrets(t *testing.T) {
	t.Parallel()
	s := sensitiveServer(t)
	rec := s.record()
	for k, v := range rec.Env {
		if isDigest(v) != (k == "HF_TOKEN") {
			t.Errorf("env[%q] recorded as %q", k, v)
		}
	}
	for k, v := range rec.Flags {
		if isDigest(v) != (k == "api-key") {
			t.Errorf("flags[%q] recorded as %q", k, v)
		}
	}
	b, _ := json.Marshal(&rec)
	for _, secret := range []string{"hf_secret_one", "sk-api-key-one"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("the record holds the secret %q: %s", secret, b)
		}
	}
	if len(rec.Argv) != 1 || !isDigest(rec.Argv[0]) {
		t.Errorf("argv holds a secret flag and must be recorded as a digest: %q", rec.Argv)
	}

	got := sensitiveServer(t, "cuda=0", "tok=hf_secret_two").identityChanges(&rec)
	for i := range got {
		got[i].Effect, got[i].Reason = "", ""
	}
	want := []agent.Change{
		{Attr: `env["CUDA_VISIBLE_DEVICES"]`, Old: "0,1", New: "0", HasOld: true, HasNew: true},
		{Attr: `env["HF_TOKEN"]`, Old: agent.Raw("(sensitive)"), New: "hf_secret_two", HasOld: true, HasNew: true, Sensitive: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
}

// liveSensitivePlan is a server on the fake with a secret among its env variables and
// one among its flags (the fake accepts --api-key).
const liveSensitivePlan = `
variable "fake" {}
variable "logs" {}
variable "port" { type = number }
variable "tok" {
  default   = "hf_secret_one"
  sensitive = true
}
variable "key" {
  default   = "sk-api-key-one"
  sensitive = true
}
server "qwen" {
  command = [var.fake]
  flags = {
    "model-path" = "Qwen/Qwen3-8B"
    "port"       = var.port
    "api-key"    = var.key
  }
  env  = { HF_TOKEN = var.tok, FAKE_SGLANG = "crash-after=2m", FAKE_SGLANG_DECODE_INTERVAL = "1h" }
  port = var.port
  ready {
    http    = "/health"
    timeout = "15s"
  }
  stop {
    timeout = "1s"
  }
  log_dir = var.logs
}
`

// The same on a running server: its record rewritten as the previous agent wrote it
// (every env and flag value a digest, as in testdata/records) is a no-op for plan and
// apply (same PID, same generation); a rotated token then relaunches it once, the
// restart naming env["HF_TOKEN"] alone.
func TestSensitiveLegacyRecordOfARunningServerIsNoOp(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	engine := func(vars ...string) *agent.Engine {
		vars = append([]string{"fake=" + fakeSGLang(t), "logs=" + h.logs(), "port=" + fmt.Sprint(h.port)}, vars...)
		return restest.Engine(t, h.dir, liveSensitivePlan, kindsFor(resources.Machine{}), h.store, agent.Options{}, vars...)
	}
	mustOK(t, engine().Apply(context.Background(), nil).Steps[0])
	first := h.record()

	legacy := first
	legacy.Env, legacy.Flags = map[string]string{}, map[string]string{}
	for k, v := range first.Env {
		if !isDigest(v) {
			v = secretDigest(v)
		}
		legacy.Env[k] = v
	}
	for k, v := range first.Flags {
		if !isDigest(v) {
			v = secretDigest(v)
		}
		legacy.Flags[k] = v
	}
	if len(first.Argv) != 1 || !isDigest(first.Argv[0]) {
		t.Fatalf("argv with a secret flag recorded as %q, want one digest (as before)", first.Argv)
	}
	if err := h.store.Save("server.qwen", &legacy); err != nil {
		t.Fatal(err)
	}

	if st := engine().Plan(context.Background()).Steps[0]; st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan over the previous agent's record: %v %+v (an upgrade would relaunch every server)", st.Err, st.Diff)
	}
	mustOK(t, engine().Apply(context.Background(), nil).Steps[0])
	if r := h.record(); r.id() != first.id() || r.Generation != 1 || !alive(first.id()) {
		t.Fatalf("the server was touched: %+v", r)
	}

	st := engine("tok=hf_secret_two").Plan(context.Background()).Steps[0]
	if st.Err != nil || st.Diff.Action != agent.Restart || len(st.Diff.Changes) != 1 {
		t.Fatalf("rotated token: %v %+v, want one restart change", st.Err, st.Diff)
	}
	if c := st.Diff.Changes[0]; c.Attr != `env["HF_TOKEN"]` || !c.Sensitive || c.Reason != agent.ReasonIdentity {
		t.Errorf("rotated token: %+v, want env[\"HF_TOKEN\"], sensitive, reason identity", c)
	}
	mustOK(t, engine("tok=hf_secret_two").Apply(context.Background(), nil).Steps[0])
	if r := h.record(); r.Generation != 2 || alive(first.id()) || !alive(r.id()) {
		t.Errorf("after the rotation: record %+v, first alive %v", r, alive(first.id()))
	}
}
