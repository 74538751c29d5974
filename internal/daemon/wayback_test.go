package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// switchPlan is a server launched from a download, with the loop pruning orphans: MODEL
// names the download (m1, m2), FAULTS the fake's faults.
const switchPlan = `
agent { prune = true }
variable "fake" {}
variable "root" {}
variable "url" {}
variable "port" { type = number }
download "MODEL" {
  dest = "${var.root}/models/MODEL"
  file "config.json" {
    url    = "${var.url}/config.json"
    sha256 = "09658d872f20c3197bf532fa33c11d4760908086319aae315238459ce31b6989"
    size   = 97
  }
}
server "s" {
  command = [var.fake]
  flags   = { "model-path" = download.MODEL.dest, "port" = var.port }
  env     = { FAKE_SGLANG = "FAULTS", HOME = var.root }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "200ms"
  }
  stop {
    timeout = "2s"
  }
  log_dir = "${var.root}/logs"
}
`

func switchTo(model, faults string) string {
	return strings.ReplaceAll(strings.ReplaceAll(switchPlan, "MODEL", model), "FAULTS", faults)
}

// Issue 35, point 1, under agent run: a model switch whose new generation fails is
// rolled back to generation 1's command line, which runs from m1, so m1 (an orphan the
// loop prunes) is kept, with why, for as long as the rolled-back generation serves; the
// plan's next change that works deletes m1 once server.s is verified on m2.
func TestModelSwitchUnderRunKeepsTheWayBack(t *testing.T) {
	t.Parallel()
	fake, root := fakeRoot(t)
	origin := testbin.QuickstartModel(t)
	stateDir, planPath := "", ""
	base, logs := runReal(t, switchTo("m1", ""), []string{"fake=" + fake, "root=" + root, "url=" + origin.URL, "port=" + strconv.Itoa(testbin.FreePort(t))},
		func(c *Config) {
			stateDir, planPath = c.StateDir, c.PlanPath
			c.BackoffMin, c.BackoffMax = 500*time.Millisecond, 2*time.Second
		})
	record := func() (r struct {
		Generation int `json:"generation"`
		Argv       []string
	}) {
		b, _ := os.ReadFile(filepath.Join(stateDir, "resources", "server.s.json"))
		json.Unmarshal(b, &r)
		return r
	}
	serving := func(gen int) func() bool {
		return func() bool {
			r := statusOf(t, base, "server.s")
			return r.Error == "" && r.Status != nil && record().Generation == gen && strings.Contains(r.Status.Summary, "running")
		}
	}
	write := func(src string) {
		t.Helper()
		if err := os.WriteFile(planPath+".tmp", []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(planPath+".tmp", planPath); err != nil {
			t.Fatal(err)
		}
	}
	m1 := filepath.Join(root, "models", "m1", "config.json")
	waitLong(t, "generation 1 verified", 60*time.Second, serving(1))

	write(switchTo("m2", "oom"))
	var o, s any
	defer func() {
		if t.Failed() {
			t.Logf("last status: download.m1 %+v, server.s %+v", o, s)
		}
	}()
	waitLong(t, "the failed switch rolled back to generation 1's command line, and m1 kept", 30*time.Second, func() bool {
		m, srv := statusOf(t, base, "download.m1"), statusOf(t, base, "server.s")
		o, s = m.Status, srv.Status
		return serving(3)() && m.Status != nil && strings.Contains(m.Status.Summary, "kept while server.s serves its last good generation, launched from it")
	})
	time.Sleep(3 * time.Second) // several passes of the loop (backoff 0.5–2 s)
	if _, err := os.Stat(m1); err != nil {
		t.Fatalf("m1's weights are gone while generation 3 runs from them: %v", err)
	}
	if a := strings.Join(record().Argv, " "); !strings.Contains(a, "models/m1") {
		t.Errorf("generation 3 does not run generation 1's command line: %s", a)
	}

	write(switchTo("m2", ""))
	waitLong(t, "m1 deleted after the switch", 90*time.Second, func() bool {
		_, err := os.Stat(filepath.Dir(m1))
		return os.IsNotExist(err)
	})
	if a := strings.Join(record().Argv, " "); !strings.Contains(a, "models/m2") || record().Generation != 4 {
		t.Fatalf("m1 was deleted, but server.s does not serve from m2: generation %d, %s", record().Generation, a)
	}
	l := logs.String()
	verified := strings.LastIndex(l, `msg="applied and verified" resource=server.s`)
	deleted := strings.Index(l, `msg="applied and verified" resource=download.m1 action=delete`)
	if verified < 0 || deleted < verified {
		t.Errorf("m1 was deleted (at %d of the log) before server.s was verified on m2 (at %d)", deleted, verified)
	}
}
