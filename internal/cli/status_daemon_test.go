package cli

import (
	"bytes"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/plans"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// checkGolden compares got with testdata/NAME, which -update rewrites.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (-update rewrites it):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

// statusReport is a status with fields of several widths on each resource, a degraded
// one, a failed one and a cluster member: what the columns must survive.
func statusReport() *agent.Report {
	return &agent.Report{Steps: []*agent.Step{
		{Addr: "container.sglang", Status: &agent.Status{Healthy: true, Summary: "running", Fields: []agent.Field{
			{Name: "member", Value: "kpro5"}, {Name: "image", Value: "ubuntu-24.04"}, {Name: "gpus", Value: "2 (passed through)"}}}},
		{Addr: "download.qwen", Status: &agent.Status{Healthy: false, Summary: "downloading: 12.0 GiB of 52.0 GiB", Fields: []agent.Field{
			{Name: "rate", Value: "812 MiB/s"}, {Name: "eta", Value: "50s"}, {Name: "files", Value: "3 of 14 verified"}}}},
		{Addr: "server.qwen", Status: &agent.Status{Healthy: true, Summary: "running, ready, generation 2", Fields: []agent.Field{
			{Name: "pid", Value: "4242"}, {Name: "started", Value: "2026-12-02 15:08:22 (5m8s ago)"}, {Name: "log", Value: "/var/log/agent/qwen.2.log"},
			{Name: "newest log line", Value: "2s ago"}, {Name: "accept rate", Value: "0.97"}, {Name: "smoke test", Value: "passed"}, {Name: "member", Value: "kpro5"}}}},
		{Addr: "file.motd", Err: errors.New("file.motd: read /etc/motd: permission denied")},
	}}
}

// `agent status` answered by `agent run` (its /status) renders exactly as a local status
// of the same observations: one code path (View.Status), the columns aligned per
// resource. Golden: testdata/status_from_daemon.golden.
func TestStatusFromDaemonRendersAsLocal(t *testing.T) {
	t.Parallel()
	rep := statusReport()
	red := agent.NewRedactor(nil)
	const stateDir = "/var/lib/agent-test"
	doc := agent.JSON("status", rep, &plans.Plan{}, red)
	doc.StateDir = stateDir
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
		case "/status":
			agent.WriteJSON(w, doc)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var local, remote bytes.Buffer
	(&agent.View{W: &local, Redact: red}).Status(rep)
	code, ok := statusFromDaemon(&plans.Plan{Agent: plans.AgentSettings{MetricsListen: addr}}, stateDir, false, &remote, red)
	if !ok || code != ExitError {
		t.Fatalf("statusFromDaemon = %d, %v; want the daemon's answer with exit code %d (a resource failed)", code, ok, ExitError)
	}
	header := "(from agent run at " + addr + ")\n"
	if got, want := remote.String(), header+local.String(); got != want {
		t.Errorf("the daemon's status renders differently from a local one:\n--- daemon\n%s--- local\n%s", got, want)
	}
	checkGolden(t, "status_from_daemon.golden", strings.Replace(remote.String(), addr, "127.0.0.1:PORT", 1))
}
