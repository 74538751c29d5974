// Package example checks the seed deployment: it validates for each host, and its fakes
// variant applies to the point where the server is verified ready (smoke test included).
package example

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/cli"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/testbin"
)

func agent(t *testing.T, want int, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(args, &out, &errb)
	if code != want {
		t.Fatalf("agent %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, want, out.String(), errb.String())
	}
	return out.String() + errb.String()
}

// TestValidates: the seed plan validates with each host's variables, both as its main file
// and as the directory (whose *.vars.hcl are not plan files), and is canonically formatted.
func TestValidates(t *testing.T) {
	for _, vars := range []string{"kpro5.vars.hcl", "kpro6.vars.hcl", "fakes.vars.hcl"} {
		t.Run(vars, func(t *testing.T) {
			for _, plan := range []string{"main.hcl", "."} {
				out := agent(t, 0, "validate", plan, "-var-file", vars, "--json")
				var res struct {
					OK bool `json:"ok"`
				}
				if err := json.Unmarshal([]byte(out), &res); err != nil || !res.OK {
					t.Errorf("validate %s -var-file %s: %v\n%s", plan, vars, err, out)
				}
			}
		})
	}
	agent(t, 0, "fmt", "-check", "main.hcl")
}

// hub is the smallest Hugging Face Hub the download resource needs: the tree of one
// pinned commit and its resolve URLs.
func hub(t *testing.T, repo, commit string, files map[string][]byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case p == "/api/models/"+repo+"/tree/"+commit:
			var entries []map[string]any
			for name, data := range files {
				sum := sha256.Sum256(data)
				entries = append(entries, map[string]any{"type": "file", "path": name, "oid": "0", "size": len(data),
					"lfs": map[string]any{"oid": hex.EncodeToString(sum[:]), "size": len(data)}})
			}
			json.NewEncoder(w).Encode(entries)
		case strings.HasPrefix(p, "/"+repo+"/resolve/"+commit+"/"):
			name := strings.TrimPrefix(p, "/"+repo+"/resolve/"+commit+"/")
			data, ok := files[name]
			if !ok {
				http.NotFound(w, r)
				return
			}
			http.ServeContent(w, r, name, fakeTime, bytes.NewReader(data))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestFakesApply applies the fakes variant: the driver is converged in a fake host root,
// the container is created (stopped) in a private Incus with both GPU devices and the
// read-only weights disk, the weights come from the fake Hub, and the fake SGLang is
// launched with the MTP and memory flags and verified ready, smoke test passed.
func TestFakesApply(t *testing.T) {
	d := incustest.Start(t)
	work := t.TempDir()
	testbin.NoLeaks(t, work)
	root := filepath.Join(work, "host")
	for name, content := range map[string]string{
		"proc/driver/nvidia/version":                       "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n",
		"proc/driver/nvidia/gpus/0000:01:00.0/information": "Model: \t\t NVIDIA RTX A6000\nBus Location: \t 0000:01:00.0\n",
		"proc/driver/nvidia/gpus/0000:c1:00.0/information": "Model: \t\t NVIDIA RTX A6000\nBus Location: \t 0000:c1:00.0\n",
		"proc/modules": "nvidia 11313152 2 - Live 0x0000000000000000 (POE)\n",
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05": "",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("libnvidia-ml.so.580.95.05", filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENT_HOST_ROOT", root)

	fake := testbin.FakeSGLang(t)
	weights := map[string][]byte{
		"config.json":                      []byte(`{"architectures": ["Qwen3_5ForConditionalGeneration"]}` + "\n"),
		"model-00001-of-00002.safetensors": bytes.Repeat([]byte("bf16"), 4096),
		"model-00002-of-00002.safetensors": bytes.Repeat([]byte("mtp!"), 2048),
		"tokenizer.json":                   []byte("{}\n"),
	}
	srv := hub(t, "Qwen/Qwen3.6-27B", strings.Repeat("0", 40), weights)
	token := filepath.Join(work, "hf-token")
	if err := os.WriteFile(token, []byte("hf_fake\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(work, "state")
	name := d.InstanceName(t)
	args := func(cmd string) []string {
		// The guard says kpro5; this machine is not: the migration step's override.
		return []string{cmd, "main.hcl", "--state-dir", state, "-var-file", "fakes.vars.hcl", "--host-override", "kpro5",
			"-var", "incus_socket=" + d.Socket, "-var", "container_name=" + name,
			"-var", "model_root=" + filepath.Join(work, "models"), "-var", "hf_endpoint=" + srv.URL,
			"-var", "hf_token_file=" + token, "-var", fmt.Sprintf("sglang_command=[%q]", fake),
			"-var", "log_dir=" + filepath.Join(work, "logs")}
	}
	t.Cleanup(func() { stopServer(t, state) })
	out := agent(t, 2, args("plan")...)
	t.Logf("plan:\n%s", out)
	out = agent(t, 0, args("apply")...)
	t.Logf("apply:\n%s", out)
	for _, want := range []string{"download.qwen: created and verified", "container.sglang: created and verified", "server.qwen: created and verified"} {
		if !strings.Contains(out, want) {
			t.Errorf("apply output lacks %q", want)
		}
	}
	out = agent(t, 0, args("plan")...)
	if !strings.Contains(out, "No changes.") {
		t.Errorf("plan after apply:\n%s", out)
	}
	out = agent(t, 0, args("status")...)
	t.Logf("status:\n%s", out)
	for _, want := range []string{"running, ready, generation 1", "smoke test", "passed", "accept rate"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q", want)
		}
	}
	inst, _, err := d.Client.GetInstance(t.Context(), name)
	if err != nil {
		t.Fatal(err)
	}
	if g := inst.Devices["gpu1"]; g["type"] != "gpu" || g["pci"] != "0000:c1:00.0" {
		t.Errorf("gpu1 device: %v", g)
	}
	if m := inst.Devices["models"]; m["readonly"] != "true" || m["path"] != "/models" || m["source"] != filepath.Join(work, "models", "Qwen3.6-27B") {
		t.Errorf("models disk: %v", m)
	}
	if _, err := os.Stat(filepath.Join(work, "logs", "qwen.1.log")); err != nil {
		t.Error(err)
	}
}

// stopServer kills the process group the state records (the fake; started by this test).
func stopServer(t *testing.T, state string) {
	b, err := os.ReadFile(filepath.Join(state, "resources", "server.qwen.json"))
	if err != nil {
		return
	}
	var rec struct {
		PGID int `json:"pgid"`
	}
	if json.Unmarshal(b, &rec) == nil && rec.PGID > 1 {
		syscall.Kill(-rec.PGID, syscall.SIGKILL)
	}
}

var fakeTime = time.Date(2026, 5, 9, 9, 20, 6, 0, time.UTC)
