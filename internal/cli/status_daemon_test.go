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
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/view"
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
	started := time.Date(2026, 12, 2, 15, 8, 22, 0, time.Local)
	return &agent.Report{Steps: []*agent.Step{
		{Addr: "container.sglang", Status: &agent.Status{Healthy: true, Summary: "running", Fields: []agent.Field{
			agent.TextField(agent.MemberField, "member", "kpro5"), agent.TextField("image", "image", "ubuntu-24.04"),
			agent.NumberField("gpus", "gpus", 2).WithText("2 (passed through)")}}},
		{Addr: "download.qwen", Status: &agent.Status{Healthy: false, Summary: "downloading: 12.0 GiB of 52.0 GiB", Fields: []agent.Field{
			agent.NumberField("rate_bytes_per_second", "rate", 812<<20).WithText("812 MiB/s"), agent.NumberField("eta_seconds", "eta", 50).WithText("50s"),
			agent.NumberField("files_verified", "files", 3).WithText("3 of 14 verified")}}},
		{Addr: "server.qwen", Status: &agent.Status{Healthy: true, Summary: "running, ready, generation 2", Fields: []agent.Field{
			agent.NumberField("pid", "pid", 4242), agent.AgeField("started_at", "started", started, started.Add(5*time.Minute+8*time.Second)),
			agent.TextField("log", "log", "/var/log/agent/qwen.2.log"),
			agent.TimeField("newest_line_at", "newest log line", started).WithText("2s ago"), agent.NumberField("accept_rate", "accept rate", 0.97),
			agent.TextField("smoke_test", "smoke test", "passed"), agent.TextField(agent.MemberField, "member", "kpro5")}}},
		{Addr: "file.motd", Err: errors.New("file.motd: read /etc/motd: permission denied")},
	}}
}

// `agent status` answered by `agent run` (its /status) renders exactly as a local status
// of the same observations: one code path (View.Status), the columns aligned per
// resource. Golden: testdata/status_from_daemon.golden.
func TestStatusFromDaemonRendersAsLocal(t *testing.T) {
	t.Parallel()
	rep := statusReport()
	red := view.NewRedactor(nil)
	const stateDir = "/var/lib/agent-test"
	doc := view.JSON("status", rep, red)
	doc.StateDir = stateDir
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
		case "/status":
			view.WriteJSON(w, doc)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var local, remote bytes.Buffer
	(&view.View{W: &local, Redact: red}).Status(rep)
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
