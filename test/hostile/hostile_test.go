package hostile_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// agent runs the agent with HOME=home (so the servers it starts are found by environ)
// and returns its combined output and exit code.
func agent(t *testing.T, home string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(testbin.Agent(t), args...)
	cmd.Env = append(os.Environ(), "HOME="+home)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestShellMetacharactersReachTheServerAsOneArgument: a flag value and an environment
// value full of shell syntax reach the server verbatim, each as one argv element or one
// environment entry: the agent execs argv, never a shell.
func TestShellMetacharactersReachTheServerAsOneArgument(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	testbin.NoLeaks(t, home)
	t.Cleanup(func() { testbin.KillServers(home) })
	pwned := filepath.Join(home, "PWNED")
	nasty := `x"; touch ` + pwned + `; echo '$(touch ` + pwned + `)' ` + "`touch " + pwned + "`" + ` && rm -rf / || true # $HOME * ? [a] {b,c} > out < in | cat \`
	model := filepath.Join(home, "models", "m")
	must(t, os.MkdirAll(model, 0o755))
	must(t, os.WriteFile(filepath.Join(model, "config.json"), []byte(`{"architectures":["Qwen3NextForCausalLM"],"model_type":"qwen3_next"}`), 0o644))
	port := testbin.FreePort(t)
	plan := filepath.Join(home, "plan.hcl")
	must(t, os.WriteFile(plan, []byte(`
variable "fake" {}
variable "port" {
  type = number
}
variable "nasty" {}
server "s" {
  command = [var.fake]
  flags = {
    "model-path"        = "`+model+`"
    "port"              = var.port
    "served-model-name" = var.nasty
  }
  env = {
    NASTY = var.nasty
  }
  port = var.port
  ready {
    http    = "/health"
    timeout = "30s"
  }
  stop {
    timeout = "5s"
  }
  log_dir = "`+filepath.Join(home, "logs")+`"
}
`), 0o644))
	out, rc := agent(t, home, "apply", plan, "--state-dir", filepath.Join(home, "state"),
		"-var", "fake="+testbin.FakeSGLang(t), "-var", "port="+strconv.Itoa(port), "-var", "nasty="+nasty)
	if rc != 0 {
		t.Fatalf("apply: exit %d\n%s", rc, out)
	}
	pids := slices.Collect(maps.Keys(testbin.Servers(home)))
	if len(pids) != 1 {
		t.Fatalf("want one server process, got %v", pids)
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/cmdline")
	must(t, err)
	argv := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
	if argv[0] != testbin.FakeSGLang(t) {
		t.Errorf("argv[0] = %q, want the command itself (no shell): %q", argv[0], argv)
	}
	found := false
	for i, a := range argv {
		if a == "--served-model-name" && i+1 < len(argv) && argv[i+1] == nasty {
			found = true
		}
	}
	if !found {
		t.Errorf("the flag value is not one argv element, verbatim: %q", argv)
	}
	environ, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/environ")
	must(t, err)
	if !bytes.Contains(append([]byte{0}, environ...), []byte("\x00NASTY="+nasty+"\x00")) {
		t.Errorf("the environment value is not verbatim")
	}
	if _, err := os.Stat(pwned); err == nil {
		t.Errorf("a shell ran the value: %s exists", pwned)
	}
}

// TestSymlinks: the policy of docs/security.md. A dest or log_dir that is itself a
// symlink is resolved: it is the operator's configuration, and pointing the models at
// another disk is what such a link is for. A symlink inside them, planted where the
// agent is about to write, is never followed: the agent replaces or skips it and the file
// it points at is untouched.
func TestSymlinks(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	testbin.NoLeaks(t, home)
	t.Cleanup(func() { testbin.KillServers(home) })
	content := []byte(`{"model_type":"qwen3_next"}` + "\n")
	sum := sha256.Sum256(content)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Unix(1700000000, 0), bytes.NewReader(content))
	}))
	defer srv.Close()

	// dest → elsewhere (resolved), with config.json inside planted → a victim file.
	elsewhere := filepath.Join(home, "big-disk", "models")
	must(t, os.MkdirAll(elsewhere, 0o755))
	dest := filepath.Join(home, "models")
	must(t, os.Symlink(elsewhere, dest))
	victim := filepath.Join(home, "victim")
	must(t, os.WriteFile(victim, []byte("precious\n"), 0o644))
	must(t, os.Symlink(victim, filepath.Join(elsewhere, "config.json")))
	must(t, os.Symlink(victim, filepath.Join(elsewhere, ".config.json.partial")))

	// log_dir → elsewhere (resolved), with generation 1's log planted → the victim.
	logsElsewhere := filepath.Join(home, "var-log")
	must(t, os.MkdirAll(logsElsewhere, 0o755))
	logDir := filepath.Join(home, "logs")
	must(t, os.Symlink(logsElsewhere, logDir))
	must(t, os.Symlink(victim, filepath.Join(logsElsewhere, "s.1.log")))

	port := testbin.FreePort(t)
	plan := filepath.Join(home, "plan.hcl")
	must(t, os.WriteFile(plan, []byte(`
variable "fake" {}
variable "port" {
  type = number
}
download "m" {
  file "config.json" {
    url    = "`+srv.URL+`/config.json"
    sha256 = "`+hex.EncodeToString(sum[:])+`"
    size   = `+strconv.Itoa(len(content))+`
  }
  dest = "`+dest+`"
}
server "s" {
  command = [var.fake]
  flags = {
    "port"       = var.port
    "model-path" = download.m.dest
  }
  port = var.port
  ready {
    http    = "/health"
    timeout = "30s"
  }
  stop {
    timeout = "5s"
  }
  log_dir = "`+logDir+`"
}
`), 0o644))
	out, rc := agent(t, home, "apply", plan, "--state-dir", filepath.Join(home, "state"),
		"-var", "fake="+testbin.FakeSGLang(t), "-var", "port="+strconv.Itoa(port))
	t.Logf("apply: exit %d\n%s", rc, out)
	if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
		t.Fatalf("a planted symlink was followed: the victim now holds %q", b)
	}
	if fi, err := os.Lstat(victim); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("victim: %v %v", fi, err)
	}
	if rc != 0 {
		// Refusing is within the policy too, as long as it says why.
		if !strings.Contains(out, "symlink") {
			t.Fatalf("apply refused without naming the symlink:\n%s", out)
		}
		return
	}
	// Resolved: the download landed behind the dest link, as a regular file.
	fi, err := os.Lstat(filepath.Join(elsewhere, "config.json"))
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("config.json behind the dest link: %v, %v; want a regular file", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(elsewhere, "config.json")); !bytes.Equal(b, content) {
		t.Errorf("config.json holds %q", b)
	}
	// The server's log: a new generation beside the planted one, not through it.
	var rec struct {
		Generation int    `json:"generation"`
		LogPath    string `json:"log_path"`
	}
	b, _ := os.ReadFile(filepath.Join(home, "state", "resources", "server.s.json"))
	json.Unmarshal(b, &rec)
	if rec.Generation < 2 {
		t.Errorf("generation %d: the planted s.1.log was reused", rec.Generation)
	}
	if fi, err := os.Lstat(filepath.Join(logsElsewhere, "s."+strconv.Itoa(rec.Generation)+".log")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("generation %d's log behind the log_dir link: %v, %v", rec.Generation, fi, err)
	}
}
