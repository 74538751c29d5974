package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/testbin"
)

var incusd = incustest.NewShared()

func TestMain(m *testing.M) { os.Exit(incusd.Run(m)) }

const (
	secret = "sk-planted-service-secret-5d1e0b"
	port   = 30111
	// watchdogSec replaces the unit's 120 s in a drop-in, so that the SIGSTOP check
	// takes seconds.
	watchdogSec = 15
	// maxExposure is the unit's measured `systemd-analyze security` level (docs/service.md),
	// rounded up: a setting dropped from the unit shows here.
	maxExposure = 5.4
)

// plan is the plan under test: one server whose first start is slow (slowStart), and a
// sensitive variable passed to it.
func plan(slowStart string, memFraction string) string {
	return fmt.Sprintf(`agent {
  metrics_listen = "127.0.0.1:9464"
  interval       = "5s"
}

variable "api_key" {
  sensitive = true
  default   = %q
}

file "model_config" {
  path    = "/srv/model/config.json"
  content = jsonencode({ architectures = ["Qwen3NextForCausalLM"], model_type = "qwen3_next" })
  mode    = "0644"
}

server "qwen" {
  command = ["/usr/local/bin/fake-sglang"]
  flags = {
    "model-path"          = dirname(file.model_config.path)
    "port"                = %d
    "mem-fraction-static" = %s
  }
  env = {
    API_KEY     = var.api_key
    FAKE_SGLANG = "slow-start=%s"
  }
  ready {
    http    = "/health"
    timeout = "3m"
  }
  stop {
    timeout = "10s"
  }
}
`, secret, port, memFraction, slowStart)
}

// TestInstalledService installs the package under a real systemd and walks through what
// an operator does to agent.service.
func TestInstalledService(t *testing.T) {
	testbin.Long(t, "boots a Debian container and installs the package")
	d := incusd.Start(t)
	image := d.DebianImage(t)
	deb := buildDeb(t, "")
	fake := testbin.FakeSGLang(t)

	c := &container{t: t, c: d.Client, name: d.InstanceName(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.Client.CreateInstance(ctx, incus.InstancesPost{
		Name:   c.name,
		Source: incus.InstanceSource{Alias: image},
		Start:  true,
	}); err != nil {
		t.Fatalf("create %s: %v\n%s", c.name, err, d.LogTail(20))
	}
	booted := time.Now()
	state := c.waitOutput("systemd to finish booting", 2*time.Minute, func(out string, code int) bool {
		return strings.HasPrefix(out, "running") || strings.HasPrefix(out, "degraded")
	}, "systemctl", "is-system-running", "--wait")
	t.Logf("systemd %s after %s", strings.TrimSpace(state), time.Since(booted).Round(time.Second))
	if strings.HasPrefix(state, "degraded") {
		t.Logf("failed units:\n%s", c.run("systemctl", "--failed", "--no-legend"))
	}
	// minbase has no procps: the unit's reload must not need /bin/kill (point 3).
	for _, p := range []string{"/bin/kill", "/usr/bin/kill"} {
		if _, code := c.exec("test", "-e", p); code == 0 {
			t.Fatalf("%s exists in the image: the reload check would prove nothing", p)
		}
	}

	// Install: dpkg -i, then systemctl enable --now (README, docs/service.md).
	c.push("/root/agent.deb", readFile(t, deb), 0o644)
	c.push("/usr/local/bin/fake-sglang", readFile(t, fake), 0o755)
	c.must("dpkg", "-i", "/root/agent.deb")
	for _, p := range []string{"/usr/bin/agent", "/lib/systemd/system/agent.service", "/usr/share/doc/agent/docs/service.md", "/etc/agent/plan.hcl"} {
		c.must("test", "-e", p)
	}
	if doc := c.must("systemctl", "show", "-P", "Documentation", "agent"); !strings.Contains(doc, "/usr/share/doc/agent/") {
		t.Errorf("Documentation= is %q, want a page under /usr/share/doc/agent", doc)
	}
	// The shipped example plan is valid as it is.
	c.must("agent", "validate", "/etc/agent/plan.hcl")

	c.push("/etc/systemd/system/agent.service.d/test.conf",
		[]byte(fmt.Sprintf("[Service]\nWatchdogSec=%ds\n", watchdogSec)), 0o644)
	c.push("/etc/agent/plan.hcl", []byte(plan("25s", "0.85")), 0o600)
	c.must("systemctl", "daemon-reload")

	// READY: Type=notify, so enable --now returns once the agent said READY=1, long
	// before the slow server is up.
	start := time.Now()
	c.must("systemctl", "enable", "--now", "agent")
	t.Logf("systemctl enable --now: %s", time.Since(start).Round(10*time.Millisecond))
	if got := strings.TrimSpace(c.run("systemctl", "is-active", "agent")); got != "active" {
		t.Fatalf("agent is %q after enable --now\n%s", got, c.journal())
	}

	// A reload while the server is still loading must succeed (point 1 is the daemon's;
	// point 3: without /bin/kill).
	first := c.waitRecord("the first launch to start", 2*time.Minute, func(r record) bool { return r.pid() > 0 })
	if r := c.record(); !r.ReadyAt.IsZero() {
		t.Fatalf("the server was ready before the reload; the slow start did not happen: %+v", r)
	}
	start = time.Now()
	if out, code := c.exec("systemctl", "reload", "agent"); code != 0 {
		t.Fatalf("systemctl reload during a slow start: exit %d\n%s\n%s", code, out, c.journal())
	}
	t.Logf("systemctl reload during a slow start: %s", time.Since(start).Round(10*time.Millisecond))
	// READY=1 came with the new plan, not at the end of the pass: the server is still
	// loading (point 1; before it, the reload waited for the whole pass and timed out).
	if r := c.record(); !r.ReadyAt.IsZero() {
		t.Errorf("systemctl reload returned only once the slow server was ready (%s)", time.Since(start).Round(time.Second))
	}

	ready := c.waitRecord("the server to be ready", 3*time.Minute, func(r record) bool { return !r.ReadyAt.IsZero() && r.PID > 0 })
	if ready.PID != first.pid() {
		t.Fatalf("the reload relaunched the server: PID %d, then %d", first.pid(), ready.PID)
	}
	server := c.identity(ready.PID)
	t.Logf("server PID %d generation %d", ready.PID, ready.Generation)

	// Point 4: the server has a HOME of its own, and it is writable.
	env := c.environ(ready.PID)
	home := env["HOME"]
	if home == "" {
		t.Fatalf("the server has no HOME: %v", env)
	}
	c.must("test", "-d", home)
	c.must("test", "-w", home)
	if env["API_KEY"] != secret {
		t.Fatalf("the planted secret did not reach the server (the journal check would be vacuous)")
	}

	// Point 2: the server runs in a transient unit of its own, not in agent.service.
	cgroup := c.must("cat", "/proc/"+strconv.Itoa(ready.PID)+"/cgroup")
	if !strings.Contains(cgroup, "/agent-server-qwen-") || strings.Contains(cgroup, "/agent.service") {
		t.Fatalf("the server's cgroup is not a unit of its own:\n%s", cgroup)
	}

	// SIGKILL of the agent, every process of its unit (systemctl kill's default): systemd
	// restarts it, the server is untouched and adopted.
	mainPID := c.mainPID()
	c.must("systemctl", "kill", "-s", "SIGKILL", "agent")
	c.waitMainPIDChange("the restart after SIGKILL", mainPID, time.Minute)
	c.waitActive(time.Minute)
	if c.identity(ready.PID) != server {
		t.Fatalf("the server (PID %d) did not survive the agent's SIGKILL", ready.PID)
	}
	c.waitFor("a pass of the restarted agent", time.Minute, func() bool {
		out, code := c.exec("agent", "status", "--json", "/etc/agent/plan.hcl")
		_ = out
		return code == 0
	})
	if r := c.record(); r.PID != ready.PID || r.Generation != ready.Generation {
		t.Fatalf("after the agent's restart the server is PID %d generation %d, want the adopted PID %d generation %d", r.PID, r.Generation, ready.PID, ready.Generation)
	}

	// Watchdog: a stopped agent pings no more; systemd kills and restarts it.
	mainPID = c.mainPID()
	restarts := c.prop("NRestarts")
	c.must("systemctl", "kill", "--kill-who=main", "-s", "SIGSTOP", "agent")
	c.waitMainPIDChange("the watchdog restart after SIGSTOP", mainPID, time.Duration(watchdogSec)*time.Second+2*time.Minute)
	c.waitActive(time.Minute)
	if got := c.prop("NRestarts"); got == restarts {
		t.Errorf("NRestarts is still %s after the watchdog", got)
	}
	// (The Go runtime's goroutine dump on the watchdog's SIGABRT follows that line.)
	if j := c.run("journalctl", "--no-pager", "-o", "cat", "-u", "agent"); !strings.Contains(j, "Watchdog timeout") {
		t.Errorf("no watchdog timeout in the journal:\n%s", c.journal())
	}
	if c.identity(ready.PID) != server {
		t.Fatalf("the server (PID %d) did not survive the watchdog restart", ready.PID)
	}

	// A plan edit: the agent sees the file change and relaunches the server, verified.
	c.push("/etc/agent/plan.hcl", []byte(plan("1s", "0.8")), 0o600)
	second := c.waitRecord("the relaunch after the plan edit", 3*time.Minute, func(r record) bool {
		return r.Generation > ready.Generation && !r.ReadyAt.IsZero()
	})
	if _, code := c.exec("test", "-e", "/proc/"+strconv.Itoa(ready.PID)); code == 0 && c.identity(ready.PID) == server {
		t.Fatalf("the old server (PID %d) still runs after the relaunch", ready.PID)
	}
	// The old generation's unit went with it: systemd saw its cgroup empty.
	if out := c.run("systemctl", "list-units", "--all", "--no-legend", fmt.Sprintf("agent-server-qwen-%d-*", ready.Generation)); strings.TrimSpace(out) != "" {
		t.Errorf("the stopped generation's unit is still there:\n%s", out)
	}
	if !strings.Contains(c.run("cat", "/proc/"+strconv.Itoa(second.PID)+"/cmdline"), "0.8") {
		t.Errorf("the relaunched server does not run the edited flags")
	}

	// An upgrade (dpkg -i of a newer package) restarts the agent, never the server.
	secondID := c.identity(second.PID)
	c.push("/root/agent-upgrade.deb", readFile(t, buildDeb(t, "1~upgrade")), 0o644)
	mainPID = c.mainPID()
	c.must("dpkg", "-i", "/root/agent-upgrade.deb")
	c.waitMainPIDChange("the restart by the upgrade", mainPID, time.Minute)
	c.waitActive(time.Minute)
	if c.identity(second.PID) != secondID {
		t.Fatalf("the upgrade stopped the server (PID %d)", second.PID)
	}

	// Stop: the agent goes, the server stays.
	c.must("systemctl", "stop", "agent")
	if got := strings.TrimSpace(c.run("systemctl", "is-active", "agent")); got != "inactive" {
		t.Errorf("agent is %q after stop", got)
	}
	second2 := c.identity(second.PID)
	if second2 == "" {
		t.Fatalf("systemctl stop agent stopped the server (PID %d)", second.PID)
	}

	// Hardening, as systemd measures it (point 5).
	sec := c.run("systemd-analyze", "security", "--no-pager", "agent")
	m := regexp.MustCompile(`Overall exposure level for agent\.service: ([0-9.]+)`).FindStringSubmatch(sec)
	if m == nil {
		t.Fatalf("systemd-analyze security: no overall level:\n%s", sec)
	}
	var exposed []string
	for _, line := range strings.Split(sec, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "✗") {
			exposed = append(exposed, strings.TrimSpace(line))
		}
	}
	t.Logf("systemd-analyze security agent: %s; exposed:\n%s", m[0], strings.Join(exposed, "\n"))
	if level, _ := strconv.ParseFloat(m[1], 64); level > maxExposure {
		t.Errorf("exposure %.1f is above %.1f: a hardening setting was lost (docs/service.md)", level, maxExposure)
	}

	// The journal never saw the planted secret.
	j := c.run("journalctl", "--no-pager", "-o", "cat", "-u", "agent")
	if strings.Contains(j, secret) {
		t.Errorf("the planted secret is in the agent's journal")
	}
	if strings.Contains(j, "left-over process") {
		t.Errorf("systemd found left-over processes in agent.service: the servers are not in units of their own")
	}
	if !strings.Contains(j, "server.qwen") {
		t.Errorf("the journal has no line about server.qwen (is it the agent's?):\n%s", j)
	}
	if all := c.run("journalctl", "--no-pager", "-o", "cat"); strings.Contains(all, secret) {
		t.Errorf("the planted secret is in the journal")
	}

	// Removal disables the agent and leaves the server and the state alone.
	c.must("dpkg", "-r", "agent")
	if _, code := c.exec("test", "-e", "/lib/systemd/system/agent.service"); code == 0 {
		t.Errorf("the unit is still installed after dpkg -r")
	}
	if c.identity(second.PID) != secondID {
		t.Errorf("dpkg -r agent stopped the server (PID %d)", second.PID)
	}
	c.must("test", "-e", "/var/lib/agent/resources/server.qwen.json")
}

// buildDeb builds the package with scripts/build-deb.sh; version "" is the script's
// default.
func buildDeb(t *testing.T, version string) string {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("sh", "scripts/build-deb.sh", out)
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = append(os.Environ(), "VERSION="+version)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/build-deb.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(b))
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// record is the part of the server's state record the test reads.
type record struct {
	PID        int       `json:"pid"`
	Generation int       `json:"generation"`
	ReadyAt    time.Time `json:"ready_at"`
	Pending    *record   `json:"pending"`
}

// pid is the launched process, recorded or pending.
func (r record) pid() int {
	if r.PID > 0 {
		return r.PID
	}
	if r.Pending != nil {
		return r.Pending.PID
	}
	return 0
}

// container runs commands in the test's instance.
type container struct {
	t    *testing.T
	c    *incus.Client
	name string
}

func (c *container) exec(argv ...string) (string, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := c.c.Exec(ctx, c.name, incus.ExecRequest{Command: argv})
	if res == nil {
		c.t.Fatalf("exec %q: %v", argv, err)
	}
	return string(res.Stdout) + string(res.Stderr), res.ExitCode
}

// run returns the output whatever the exit code.
func (c *container) run(argv ...string) string {
	c.t.Helper()
	out, _ := c.exec(argv...)
	return out
}

// must fails the test unless the command exits 0.
func (c *container) must(argv ...string) string {
	c.t.Helper()
	out, code := c.exec(argv...)
	if code != 0 {
		c.t.Fatalf("%s: exit %d\n%s\nagent journal:\n%s", strings.Join(argv, " "), code, out, c.journal())
	}
	return out
}

func (c *container) push(path string, content []byte, mode os.FileMode) {
	c.t.Helper()
	c.must("mkdir", "-p", filepath.Dir(path))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.c.PushFile(ctx, c.name, path, bytes.NewReader(content), incus.FileInfo{Mode: mode}); err != nil {
		c.t.Fatalf("push %s: %v", path, err)
	}
}

func (c *container) journal() string {
	out, _ := c.exec("journalctl", "--no-pager", "-n", "60", "-u", "agent")
	return out
}

func (c *container) waitFor(what string, limit time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %s\nagent journal:\n%s", limit, what, c.journal())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *container) waitOutput(what string, limit time.Duration, ok func(string, int) bool, argv ...string) string {
	c.t.Helper()
	var out string
	c.waitFor(what, limit, func() bool {
		var code int
		out, code = c.exec(argv...)
		return ok(out, code)
	})
	return out
}

// record reads the server's state record (zero when there is none yet).
func (c *container) record() record {
	c.t.Helper()
	out, code := c.exec("cat", "/var/lib/agent/resources/server.qwen.json")
	var r record
	if code == 0 {
		_ = json.Unmarshal([]byte(out), &r)
	}
	return r
}

func (c *container) waitRecord(what string, limit time.Duration, ok func(record) bool) record {
	c.t.Helper()
	var r record
	c.waitFor(what, limit, func() bool { r = c.record(); return ok(r) })
	return r
}

// identity is the process's PID and start time ("" when it is gone or a zombie): the
// same string twice proves the same process.
func (c *container) identity(pid int) string {
	c.t.Helper()
	out, code := c.exec("cat", "/proc/"+strconv.Itoa(pid)+"/stat")
	if code != 0 {
		return ""
	}
	i := strings.LastIndexByte(out, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(out[i+1:])
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return strconv.Itoa(pid) + "@" + f[19]
}

func (c *container) environ(pid int) map[string]string {
	c.t.Helper()
	out := c.must("cat", "/proc/"+strconv.Itoa(pid)+"/environ")
	env := map[string]string{}
	for _, kv := range strings.Split(out, "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

func (c *container) prop(name string) string {
	c.t.Helper()
	return strings.TrimSpace(c.must("systemctl", "show", "-P", name, "agent"))
}

func (c *container) mainPID() string {
	c.t.Helper()
	pid := c.prop("MainPID")
	if pid == "" || pid == "0" {
		c.t.Fatalf("agent has no main PID\n%s", c.journal())
	}
	return pid
}

func (c *container) waitMainPIDChange(what, old string, limit time.Duration) {
	c.t.Helper()
	c.waitFor(what, limit, func() bool {
		pid := c.prop("MainPID")
		return pid != "0" && pid != "" && pid != old
	})
}

func (c *container) waitActive(limit time.Duration) {
	c.t.Helper()
	c.waitFor("agent to be active", limit, func() bool { return c.prop("ActiveState") == "active" })
}
