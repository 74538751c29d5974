package export_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/cli"
	"github.com/agent-dev/agent/internal/export"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/testbin"
)

var incusd = incustest.NewShared()

func TestMain(m *testing.M) { os.Exit(incusd.Run(m)) }

func agent(t *testing.T, want int, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Main(args, &out, &errb); code != want {
		t.Fatalf("agent %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String()
}

// startFake starts the fake SGLang with argv (after the binary), its stdout in a log
// file, and kills it when the test ends (this test started it).
func startFake(t *testing.T, dir string, port int, args ...string) *exec.Cmd {
	t.Helper()
	testbin.NoLeaks(t, dir)
	fake := testbin.FakeSGLang(t)
	log, err := os.Create(filepath.Join(dir, fmt.Sprintf("server-%d.log", port)))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(fake, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "FAKE_SGLANG=crash-after=2m", "HF_TOKEN=hf_do_not_export", "CUDA_VISIBLE_DEVICES=0,1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait(); log.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake on port %d never became healthy", port)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestExportServerAdoptNoOp: a fake SGLang started outside the agent with known flags is
// exported (flags as a map, numbers as numbers, the secret left out, the port, the log,
// the weights with sizes and hashes); the export validates; plan shows one adoption and
// nothing else; apply adopts; plan says no changes; and the process is the same one
// (PID and start time): nothing was signalled.
func TestExportServerAdoptNoOp(t *testing.T) {
	dir := t.TempDir()
	models := filepath.Join(dir, "models", "Qwen3-8B")
	os.MkdirAll(models, 0o755)
	os.WriteFile(filepath.Join(models, "config.json"), []byte("{}\n"), 0o644)
	os.WriteFile(filepath.Join(models, "model.safetensors"), bytes.Repeat([]byte("w"), 4096), 0o644)
	const port = 23971
	// Flags in the agent's order (sorted by name), so the map reproduces the argv.
	cmd := startFake(t, dir, port, "--enable-metrics", "--mem-fraction-static", "0.85", "--model-path", models,
		"--port", fmt.Sprint(port), "--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "4")
	before, err := proc.FS{}.Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()

	h, err := export.Observe(context.Background(), export.Options{Ports: []int{port}, Hash: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Servers) != 1 {
		t.Fatalf("servers: %+v", h.Servers)
	}
	s := h.Servers[0]
	if s.PID != cmd.Process.Pid || !s.Canonical || s.Port != port || s.PortFrom != "flag" || s.Engine != export.EngineSGLang {
		t.Errorf("server: %+v", s)
	}
	if s.Flags["mem-fraction-static"] != 0.85 || s.Flags["speculative-num-draft-tokens"] != 4.0 || s.Flags["enable-metrics"] != true || s.Flags["speculative-algorithm"] != "NEXTN" {
		t.Errorf("flags: %#v", s.Flags)
	}
	if _, ok := s.Env["HF_TOKEN"]; ok || s.Env["CUDA_VISIBLE_DEVICES"] != "0,1" {
		t.Errorf("env: %v (secrets %v)", s.Env, s.DroppedSecrets)
	}
	if s.Log != filepath.Join(dir, fmt.Sprintf("server-%d.log", port)) {
		t.Errorf("log: %q", s.Log)
	}
	if len(h.Weights) != 1 || h.Weights[0].Dest != models || h.Weights[0].Size != 4099 || h.Weights[0].Files[1].SHA256 == "" {
		t.Errorf("weights: %+v", h.Weights)
	}

	// The CLI: export, validate, plan: one adoption (as an import: the plan writes
	// nothing), apply records it and restarts nothing, plan again: no changes.
	out := agent(t, 0, "export", "--port", fmt.Sprint(port), "--incus-socket", "none", "--hash")
	for _, want := range []string{`hostname = "` + host + `"`, `"mem-fraction-static"          = 0.85`, `"speculative-num-draft-tokens" = 4`,
		`"enable-metrics"               = true`, "Left out as secrets (their names match TOKEN|SECRET|KEY|PASSWORD|AUTH): HF_TOKEN.",
		"port    = 23971", "# download \"Qwen3-8B\" {", "#     size = 4096"} {
		if !strings.Contains(out, want) {
			t.Errorf("export lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hf_do_not_export") {
		t.Error("the secret's value is in the export")
	}
	plan := filepath.Join(dir, "host.hcl")
	os.WriteFile(plan, []byte(out), 0o644)
	state := filepath.Join(dir, "state")
	agent(t, 0, "validate", plan)
	out = agent(t, 2, "plan", plan, "--state-dir", state)
	if !strings.Contains(out, "adopt pid") || !strings.Contains(out, "Plan: 1 to adopt, 0 to create, 0 to update, 0 to restart, 0 to replace, 0 to delete.") {
		t.Errorf("first plan:\n%s", out)
	}
	if out := agent(t, 0, "apply", plan, "--state-dir", state); !strings.Contains(out, "adopted, no restart") {
		t.Errorf("apply:\n%s", out)
	}
	out = agent(t, 0, "plan", plan, "--state-dir", state)
	if !strings.Contains(out, "No changes.") {
		t.Errorf("plan after adoption:\n%s", out)
	}
	out = agent(t, 0, "status", plan, "--state-dir", state)
	if !strings.Contains(out, "adopted: not launched by this agent") {
		t.Errorf("status:\n%s", out)
	}
	after, err := proc.FS{}.Stat(cmd.Process.Pid)
	if err != nil || after.Identity() != before.Identity() || cmd.ProcessState != nil {
		t.Errorf("the server changed: before %+v, after %+v (%v)", before, after, err)
	}
}

// TestExportVerbatimArgv: flags not in the agent's order are kept verbatim in command (a
// map would change the argv and the server would not be adopted), with the map shown in a
// comment; the flow still ends in no changes.
func TestExportVerbatimArgv(t *testing.T) {
	dir := t.TempDir()
	const port = 23972
	startFake(t, dir, port, "--port", fmt.Sprint(port), "--model-path", "Qwen/Qwen3-8B", "--tp-size=2")
	out := agent(t, 0, "export", "--port", fmt.Sprint(port), "--incus-socket", "none")
	for _, want := range []string{"The command line is kept verbatim", `#     "tp-size" = 2`, `"--tp-size=2"]`,
		`not a directory path (a Hub repository id?)`} {
		if !strings.Contains(out, want) {
			t.Errorf("export lacks %q:\n%s", want, out)
		}
	}
	plan := filepath.Join(dir, "host.hcl")
	os.WriteFile(plan, []byte(out), 0o644)
	state := filepath.Join(dir, "state")
	if out := agent(t, 2, "plan", plan, "--state-dir", state); !strings.Contains(out, "adopt pid") {
		t.Errorf("first plan does not name the adoption:\n%s", out)
	}
	agent(t, 0, "apply", plan, "--state-dir", state)
	agent(t, 0, "plan", plan, "--state-dir", state)
}

// TestExportIncus: a private Incus instance with two GPUs by PCI address, a read-only
// weights disk, a proxy device and its own config is exported (server-owned keys left
// out, the image by alias), and the export plans as no changes against that daemon.
func TestExportIncus(t *testing.T) {
	d := incusd.Start(t)
	ctx := context.Background()
	name := d.InstanceName(t)
	weights := t.TempDir()
	err := d.Client.CreateInstance(ctx, incus.InstancesPost{
		Name: name, Source: incus.InstanceSource{Alias: d.Image},
		InstancePut: incus.InstancePut{
			Profiles: []string{"default"},
			Config:   map[string]string{"limits.memory": "1GiB", "user.note": "seed"},
			Devices: map[string]map[string]string{
				"gpu0":   {"type": "gpu", "pci": "0000:01:00.0"},
				"gpu1":   {"type": "gpu", "pci": "0000:c1:00.0"},
				"models": {"type": "disk", "source": weights, "path": "/models", "readonly": "true"},
				"api":    {"type": "proxy", "listen": "tcp:127.0.0.1:23973", "connect": "tcp:127.0.0.1:30000"},
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := export.Observe(ctx, export.Options{Hostname: "kpro6", Incus: d.Client, Ports: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	var got *export.Container
	for i := range h.Containers {
		if h.Containers[i].Name == name {
			got = &h.Containers[i]
		}
	}
	if got == nil {
		t.Fatalf("instance %s not exported: %+v", name, h.Containers)
	}
	for k := range got.Config {
		if strings.HasPrefix(k, "volatile.") || strings.HasPrefix(k, "image.") {
			t.Errorf("server-owned key exported: %s", k)
		}
	}
	src, err := export.Render(&export.Observation{Hostname: "kpro6", Containers: []export.Container{*got}})
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	for _, want := range []string{`image    = "busybox"`, `gpu "gpu1" {`, `pci = "0000:c1:00.0"`, `readonly = true`,
		`device "api" {`, `"limits.memory" = "1GiB"`, "running = false"} {
		if !strings.Contains(text, want) {
			t.Errorf("export lacks %q:\n%s", want, text)
		}
	}
	plan := filepath.Join(t.TempDir(), "host.hcl")
	os.WriteFile(plan, []byte(fmt.Sprintf("agent {\n  incus_socket = %q\n}\n", d.Socket)+text), 0o644)
	agent(t, 0, "validate", plan)
	out := agent(t, 0, "plan", plan, "--state-dir", filepath.Join(t.TempDir(), "state"), "--host-override", "kpro6")
	if !strings.Contains(out, "No changes.") {
		t.Errorf("plan of the export:\n%s", out)
	}
}

// TestExportServerInContainer renders a server seen inside a container: it refers to the
// container; the block is live when this agent supports servers in containers, and
// commented out with the reason until then, so the export still validates.
func TestExportServerInContainer(t *testing.T) {
	h := &export.Observation{Hostname: "kpro6",
		Containers: []export.Container{{Name: "sglang", Image: "busybox", Profiles: []string{"default"}, Running: true,
			Devices: map[string]map[string]string{"models": {"type": "disk", "source": "/srv/models/Q", "path": "/models", "readonly": "true"}}}},
		Servers: []export.Server{{Engine: export.EngineSGLang, PID: 4242, Container: "sglang", Canonical: true,
			Command: []string{"python3", "-m", "sglang.launch_server"}, Flags: map[string]any{"model-path": "/models", "port": 30000.0},
			Env: map[string]string{}, Port: 30000, PortFrom: "flag"}},
	}
	src, err := export.Render(h)
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	if !strings.Contains(text, "container = container.sglang.name") {
		t.Errorf("no container reference:\n%s", text)
	}
	// Servers inside containers are supported: the block is written live, not commented out.
	if strings.Contains(text, "# server \"sglang_30000\"") || !strings.Contains(text, "server \"sglang_30000\"") {
		t.Errorf("the server in the container is not exported as a live block:\n%s", text)
	}
}

// Issue 29 point 6: the JSON view carries format_version "3", a string as in every other
// document, and [] where nothing was found, never null.
func TestJSONViewIsVersionedWithEmptyLists(t *testing.T) {
	o := &export.Observation{FormatVersion: export.FormatVersion, Servers: []export.Server{{PID: 1}}, Driver: &export.Driver{}}
	export.EmptyNotNull(o)
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, `"format_version":"3"`) || strings.Contains(s, "null") {
		t.Errorf("export --json view: %s", s)
	}
}
