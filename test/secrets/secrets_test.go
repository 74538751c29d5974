package secrets_test

// TestPlantedSecretsAppearNowhere (issue 9, point 3): a sensitive variable (written to a
// file and passed to a server's environment) and a Hugging Face token (in a token_file,
// sent to a local Hub as Authorization) are planted; then plan, apply and status (human
// and --json), --log-level debug on stderr, an error, every file under the state dir and
// the log dir, and `agent run`'s /metrics and /status are searched for them. Each must
// appear 0 times; the test also proves the secrets were used (the file holds the value,
// the Hub saw the token) so that 0 is not vacuous. A token file readable by others is
// warned about.

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

const (
	apiSecret = "sk-planted-api-secret-7f3a9c"
	hfSecret  = "hf_plantedHubToken0123456789abcdef"
	commit    = "0123456789abcdef0123456789abcdef01234567"
)

func TestPlantedSecretsAppearNowhere(t *testing.T) {
	testbin.Long(t, "builds the agent")
	work := t.TempDir()
	agentBin, fakeBin := testbin.Agent(t), testbin.FakeSGLang(t)

	// A Hub with one file, that answers 401 without the token.
	content := []byte(`{"model_type":"qwen3_next"}` + "\n")
	blob := sha1.Sum(append([]byte("blob "+strconv.Itoa(len(content))+"\x00"), content...))
	var authOK, authBad atomic.Int32
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+hfSecret {
			authBad.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		authOK.Add(1)
		switch r.URL.Path {
		case "/api/models/org/m/tree/" + commit:
			json.NewEncoder(w).Encode([]map[string]any{{"type": "file", "path": "config.json", "size": len(content), "oid": hex.EncodeToString(blob[:])}})
		case "/org/m/resolve/" + commit + "/config.json":
			http.ServeContent(w, r, "", time.Unix(1700000000, 0), bytes.NewReader(content))
		default:
			http.NotFound(w, r)
		}
	}))
	defer hub.Close()

	host := filepath.Join(work, "host")
	state := filepath.Join(work, "state")
	must(t, os.MkdirAll(host, 0o755))
	tokenFile := filepath.Join(host, "hf-token")
	must(t, os.WriteFile(tokenFile, []byte(hfSecret+"\n"), 0o600))
	port := testbin.FreePort(t)
	planFile := filepath.Join(work, "plan.hcl")
	must(t, os.WriteFile(planFile, []byte(plan), 0o644))
	badFile := filepath.Join(work, "bad.hcl")
	must(t, os.WriteFile(badFile, []byte(badPlan), 0o644))
	testbin.NoLeaks(t, work)
	t.Cleanup(func() { testbin.KillServers(work) }) // servers' HOME: <state>/home

	var transcript bytes.Buffer // everything the agent printed
	run := func(want int, args ...string) string {
		t.Helper()
		if args[0] != "validate" { // validate touches no host: it takes no --state-dir
			args = append(args, "--state-dir", state)
		}
		args = append(args, "--log-level", "debug",
			"-var", "root="+host, "-var", "fake_sglang="+fakeBin, "-var", "port="+strconv.Itoa(port),
			"-var", "hub="+hub.URL, "-var", "api_key="+apiSecret)
		cmd := exec.Command(agentBin, args...)
		cmd.Env = append(os.Environ(), "HOME="+host)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		rc := 0
		if ee, ok := err.(*exec.ExitError); ok {
			rc = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		transcript.WriteString("$ agent " + strings.Join(args[:2], " ") + "\n" + out.String())
		if rc != want {
			t.Fatalf("agent %s: exit %d, want %d\n%s", strings.Join(args[:2], " "), rc, want, out.String())
		}
		return out.String()
	}

	// The token file readable by others: warned (while the Hub is asked), and still not
	// printed.
	must(t, os.Chmod(tokenFile, 0o644))
	out := run(2, "plan", planFile)
	if !strings.Contains(out, "token_file "+tokenFile+" has mode 0644") {
		t.Errorf("no warning about the token file's mode:\n%s", out)
	}
	must(t, os.Chmod(tokenFile, 0o600))
	run(2, "plan", planFile, "--json")
	run(0, "apply", planFile)
	run(0, "apply", planFile, "--json")
	run(0, "status", planFile)
	run(0, "status", planFile, "--json")
	run(0, "validate", planFile)
	run(1, "apply", badFile) // errors that would quote the secrets
	run(1, "plan", badFile, "--json")

	// agent run: its /metrics and /status.
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	daemon := exec.Command(agentBin, "run", planFile, "--listen", listen, "--interval", "1s", "--state-dir", state, "--log-level", "debug",
		"-var", "root="+host, "-var", "fake_sglang="+fakeBin, "-var", "port="+strconv.Itoa(port),
		"-var", "hub="+hub.URL, "-var", "api_key="+apiSecret)
	daemon.Env = append(os.Environ(), "HOME="+host)
	var dout bytes.Buffer
	daemon.Stdout, daemon.Stderr = &dout, &dout
	must(t, daemon.Start())
	endpoints := map[string]string{}
	deadline := time.Now().Add(30 * time.Second)
	for _, path := range []string{"/metrics", "/status"} {
		for {
			resp, err := http.Get("http://" + listen + path)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 && len(b) > 0 {
					endpoints[path] = string(b)
					break
				}
			}
			if time.Now().After(deadline) {
				daemon.Process.Kill()
				daemon.Wait()
				t.Fatalf("agent run: %s did not answer: %v\n%s", path, err, dout.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	time.Sleep(1500 * time.Millisecond) // a reconcile pass with debug logs
	daemon.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- daemon.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		daemon.Process.Kill()
		<-done
	}
	transcript.WriteString("$ agent run\n" + dout.String())

	// The secrets were used: the 0 below is not vacuous.
	if b, _ := os.ReadFile(filepath.Join(host, "api-key")); string(b) != apiSecret {
		t.Fatalf("the sensitive variable did not reach its file: %q", b)
	}
	if authOK.Load() == 0 {
		t.Fatal("the Hub never saw the token")
	}
	if !strings.Contains(endpoints["/metrics"], "agent_") {
		t.Errorf("/metrics looks empty:\n%s", endpoints["/metrics"])
	}

	// Count: output, endpoints, every file under the state and log dirs.
	places := map[string]string{"agent output (plan, apply, status, validate, errors, --json, debug logs, agent run)": transcript.String()}
	for p, b := range endpoints {
		places["agent run "+p] = b
	}
	for _, dir := range []string{state, filepath.Join(host, "logs"), filepath.Join(host, "models")} {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				b, _ := os.ReadFile(p)
				places[p] = string(b)
			}
			return nil
		})
	}
	leaks := 0
	for where, text := range places {
		for _, s := range []string{apiSecret, hfSecret} {
			if n := strings.Count(text, s); n > 0 {
				leaks += n
				t.Errorf("%s: the planted secret %.8s… appears %d times", where, s, n)
			}
		}
	}
	t.Logf("searched %d places (%d bytes): secrets leaked = %d", len(places), func() (n int) {
		for _, s := range places {
			n += len(s)
		}
		return
	}(), leaks)
	fmt.Printf("SECRETS places=%d leaked=%d\n", len(places), leaks)
}

const plan = `
variable "root" {}
variable "fake_sglang" {}
variable "hub" {}
variable "port" {
  type = number
}
variable "api_key" {
  sensitive = true
}

file "api_key" {
  path    = "${var.root}/api-key"
  content = var.api_key
  mode    = "0600"
}

download "m" {
  huggingface {
    repo       = "org/m"
    revision   = "` + commit + `"
    token_file = "${var.root}/hf-token"
    endpoint   = var.hub
  }
  dest = "${var.root}/models/m"
}

server "s" {
  command = [var.fake_sglang]
  flags = {
    "model-path" = download.m.dest
    "port"       = var.port
  }
  env = {
    SGLANG_API_KEY = var.api_key
  }
  port       = var.port
  depends_on = [file.api_key]
  ready {
    http    = "/health"
    timeout = "30s"
  }
  stop {
    timeout = "5s"
  }
  log_dir = "${var.root}/logs"
}
`

// badPlan fails in ways whose messages would quote the secrets: a file source named
// after the sensitive value, and a Hub repository that does not exist (401/404 with the
// token sent).
const badPlan = `
variable "root" {}
variable "fake_sglang" {}
variable "hub" {}
variable "port" {
  type = number
}
variable "api_key" {
  sensitive = true
}

file "leak" {
  path   = "${var.root}/leak"
  source = "/nonexistent/${var.api_key}"
}

download "missing" {
  huggingface {
    repo       = "org/missing"
    revision   = "` + commit + `"
    token_file = "${var.root}/hf-token"
    endpoint   = var.hub
  }
  dest = "${var.root}/models/missing"
}
`

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
