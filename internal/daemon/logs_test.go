package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// tokenPlan is a server whose environment carries a sensitive token and which ignores
// SIGTERM (its stop waits the whole 4 s timeout, then SIGKILLs it); a file waits for it,
// and another file cannot be written (its parent is a file).
const tokenPlan = `
variable "fake" {}
variable "root" {}
variable "port" { type = number }
variable "token" {
  sensitive = true
  default   = "TOKEN"
}
server "qwen" {
  command = [var.fake]
  flags   = { "model-path" = "${var.root}/model", "port" = var.port }
  env     = { FAKE_SGLANG = "ignore-sigterm", HOME = var.root, HF_TOKEN = var.token }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "200ms"
  }
  stop {
    timeout = "4s"
  }
  log_dir = "${var.root}/logs"
}
file "after" {
  path       = "${var.root}/after.txt"
  content    = "the server is up\n"
  depends_on = [server.qwen]
}
file "broken" {
  path    = "${var.root}/model/config.json/x"
  content = "cannot be written: config.json is a file\n"
}
`

// Issue 17, point 5: the loop's log explains itself. Its first line says what runs; a
// rotated token appears as a restart naming env["HF_TOKEN"] with its reason and never its
// values; the stop of a server that ignores SIGTERM is logged every second (here) with
// where it stands; at --log-level debug the queue, the observations with their verdicts,
// the watches, the dependency waits and the backoff decisions are all there.
func TestLogExplainsStartRestartsStopsAndDebug(t *testing.T) {
	t.Parallel()
	const oldToken, newToken = "hf_OldTokenValue1234", "hf_NewTokenValue5678"
	fake, root := fakeRoot(t)
	logs := &syncBuffer{}
	var planPath, stateDir string
	base, _ := runReal(t, strings.Replace(tokenPlan, "TOKEN", oldToken, 1), []string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t))},
		func(c *Config) {
			planPath, stateDir = c.PlanPath, c.StateDir
			c.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c.Version = "1.2.3-test"
			c.StartAttrs = []slog.Attr{slog.Bool("servers_in_systemd_units", false)}
			c.StopProgress = time.Second
			c.BackoffMin = time.Minute // file.broken fails once within the test
		})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("debug log:\n%s", logs.String())
		}
	})
	waitLong(t, "generation 1 verified and file.after written", 60*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		_, err := os.Stat(filepath.Join(root, "after.txt"))
		return r.Error == "" && r.Status != nil && r.Status.Healthy && readRecord(stateDir).Generation == 1 && err == nil
	})
	first := readRecord(stateDir)

	// The token rotates: the plan file changes, the loop reloads and restarts the server.
	rotated := strings.Replace(tokenPlan, "TOKEN", newToken, 1)
	if err := os.WriteFile(planPath+".tmp", []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(planPath+".tmp", planPath); err != nil {
		t.Fatal(err)
	}
	waitLong(t, "generation 2 verified, then file.after observed again", 90*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		return r.Error == "" && r.Status != nil && r.Status.Healthy && readRecord(stateDir).Generation == 2 &&
			regexp.MustCompile(`msg=converged resource=server\.qwen action=restart(.|\n)*msg=reconciled resource=file\.after took=\S+ observed=no-op`).MatchString(logs.String())
	})
	out := logs.String()

	lines := func(pattern string) []string {
		return regexp.MustCompile(`(?m)^.*`+pattern+`.*$`).FindAllString(out, -1)
	}
	want := func(what, pattern string) {
		t.Helper()
		if len(lines(pattern)) == 0 {
			t.Errorf("the log has no %s (no line matches %s)", what, pattern)
		}
	}
	// The start line, first of all.
	startLine := regexp.MustCompile(`msg="agent run starting" version=1\.2\.3-test pid=` + strconv.Itoa(os.Getpid()) +
		` plan=` + regexp.QuoteMeta(planPath) + ` plan_files=` + regexp.QuoteMeta(planPath) + ` resources=3 state_dir=` + regexp.QuoteMeta(stateDir) +
		` parallelism=4 interval=10s listen=127\.0\.0\.1:\d+ prune=false servers_in_systemd_units=false`)
	if first := strings.SplitN(out, "\n", 2)[0]; !startLine.MatchString(first) {
		t.Errorf("the first line is not the start line:\n%s", first)
	}
	// The restart names the rotated variable, its effect and reason, never its values.
	want("restart naming env[\"HF_TOKEN\"]", regexp.QuoteMeta(`msg=applying resource=server.qwen action=restart changes.env.HF_TOKEN.sensitive=true changes.env.HF_TOKEN.effect=restart changes.env.HF_TOKEN.reason=identity`))
	for _, tok := range []string{oldToken, newToken} {
		if strings.Contains(out, tok) {
			t.Errorf("the log shows a token value %q", tok)
		}
	}
	// The stop's progress: SIGTERM ignored, a line a second until SIGKILL.
	progress := lines(`msg="stopping server\.qwen: pid ` + strconv.Itoa(first.PID) + `, [0-9] s of 4 s, SIGTERM sent; [0-9]+ process(es)? left" resource=server\.qwen pid=` + strconv.Itoa(first.PID) + ` signal=SIGTERM`)
	if len(progress) < 2 {
		t.Errorf("%d stop progress lines during a 4 s wait at one a second, want 2 or more", len(progress))
	}
	want("stop result", `msg=stopped resource=server\.qwen generation=1 pid=`+strconv.Itoa(first.PID)+` result="[0-9]+ processes stopped \([0-9]+ needed SIGKILL\)`)
	want("reload line", `msg="plan loaded" plan=`+regexp.QuoteMeta(planPath)+` resources=3`)
	// Debug: why each resource was looked at, what was seen, what it waits for.
	want("queue add", `level=DEBUG msg=queued resource=server\.qwen$`)
	want("queue timer", `level=DEBUG msg="next reconcile scheduled" resource=server\.qwen in=`)
	want("observation with its verdict", `level=DEBUG msg=reconciled resource=server\.qwen took=\S+ observed=restart changes\.env\.HF_TOKEN\.sensitive=true .* applied=true`)
	want("no-op observation", `level=DEBUG msg=reconciled resource=file\.after took=\S+ observed=no-op applied=false`)
	want("watch armed", `level=DEBUG msg="watching for changes" resource=server\.qwen`)
	want("nothing to watch", `level=DEBUG msg="nothing to watch; observed at each resync" resource=file\.after`)
	want("dependency wait", `level=DEBUG msg="waiting for a dependency" resource=file\.after dependency=server\.qwen`)
	want("status observation", `level=DEBUG msg="status observed" resource=server\.qwen healthy=true`)
	want("backoff decision with its delay", `level=ERROR msg="resource failed" resource=file\.broken .* failures=1 retry_in=(?:[0-9]+m)?[0-9.]+s terminal=false`)
}
