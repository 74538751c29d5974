package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// The fake SGLang server built statically, to run in the busybox container.
// staticFakeSGLang is the fake SGLang server, static so it runs inside busybox.
func staticFakeSGLang(t *testing.T) string { return testbin.FakeSGLang(t) }

// pushFakeSGLang installs the static fake SGLang in the instance as /usr/bin/fake-sglang
// (the test image has no Go runtime, and no libc for a dynamic one).
func pushFakeSGLang(t *testing.T, c *incus.Client, instance string) {
	t.Helper()
	f, err := os.Open(staticFakeSGLang(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := c.PushFile(context.Background(), instance, "/usr/bin/fake-sglang", f, incus.FileInfo{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
}

// ctrSrvContainer is the container block: busybox with a proxy device from a loopback
// port of the host to the server's port inside.
const ctrSrvContainer = `
variable "incus_socket" {}
variable "name" {}
variable "hport" { type = number }
variable "port" { type = number }
agent { incus_socket = var.incus_socket }

container "c" {
  name  = var.name
  image = "busybox"
  stop_timeout = "10s"
  device "api" {
    type    = "proxy"
    options = { listen = "tcp:127.0.0.1:${var.hport}", connect = "tcp:127.0.0.1:${var.port}" }
  }
}
`

// ctrSrvServer is the fake server in that container. Its environment and arguments
// carry shell metacharacters: they must arrive verbatim. Its settle is 1 s, not the
// default 3 s: no test of it is about the settle period (server_verify_test.go is), and
// the tests launch it many times.
const ctrSrvServer = `
variable "mem" {
  type    = number
  default = 0.8
}
variable "faults" { default = "" }
variable "revert" { default = true }

server "qwen" {
  container = container.c.name
  revert    = var.revert
  command   = ["fake-sglang"]
  flags = {
    "model-path"                   = "Qwen/Qwen3-8B"
    "port"                         = var.port
    "mem-fraction-static"          = var.mem
    "speculative-algorithm"        = "NEXTN"
    "speculative-num-draft-tokens" = 4
    "enable-metrics"               = true
  }
  args = ["--served-model-name", "it's \"$(touch /pwned)\" ` + "`id`" + ` ; $HOME * \\"]
  env  = {
    FAKE_SGLANG                 = var.faults
    FAKE_SGLANG_DECODE_INTERVAL = "100ms"
    WEIRD                       = "a b'c\"$(touch /pwned) ; *\nline2"
  }
  port = var.port
  ready {
    http     = "/health"
    log_line = "The server is fired up and ready to roll!"
    timeout  = "20s"
    settle   = "1s"
  }
  stop {
    timeout = "1s"
  }
  smoke_test {
    prompt         = "What is 2+2? Answer with one number."
    sampling       = { temperature = 0.7, top_p = 0.8, presence_penalty = 1.5 }
    max_tokens     = 64
    expect         = "4"
    max_repetition = 0.3
  }
}
`

// ctrSrvHarness runs successive agent runs (a fresh engine each: an agent restart) on
// one state directory, against the private incusd.
type ctrSrvHarness struct {
	srvState
	d           *incustest.Daemon
	name        string
	hport, port int
}

func newCtrSrvHarness(t *testing.T) *ctrSrvHarness {
	t.Helper()
	d := incusd.Start(t)
	return &ctrSrvHarness{srvState: newSrvState(t), d: d, name: d.InstanceName(t), hport: srvFreePort(t), port: 30000}
}

// onMember2 is the harness for a container placed on the cluster's m2 with the server in
// it, and its engine through socket for a machine (vars: more of the plan's variables).
// The container is created (with machine m), its loopback brought up and the static
// fake pushed in: the server is what is left to apply.
func onMember2(t *testing.T, c *incustest.Cluster, socket string, m resources.Machine) (*ctrSrvHarness, func(m resources.Machine, vars ...string) *agent.Engine) {
	t.Helper()
	h := &ctrSrvHarness{srvState: newSrvState(t), d: c.Members[0].Daemon, name: c.InstanceName(t), hport: srvFreePort(t), port: 30000}
	src := strings.Replace(ctrSrvContainer, `image = "busybox"`, "image = \"busybox\"\n  target = \"m2\"", 1) + ctrSrvServer
	engine := func(m resources.Machine, vars ...string) *agent.Engine {
		vars = append([]string{"incus_socket=" + socket, "name=" + h.name, "hport=" + strconv.Itoa(h.hport), "port=" + strconv.Itoa(h.port)}, vars...)
		return restest.Engine(t, h.dir, src, kindsFor(m), h.store, agent.Options{StepTimeout: 2 * time.Minute}, vars...)
	}
	// The container first, then the program in it (as TestServerInContainer does).
	if st := engine(m).Apply(context.Background(), nil).Steps[0]; st.Addr != "container.c" || st.Err != nil {
		t.Fatalf("first apply: %s %v\n%s", st.Addr, st.Err, c.LogTail(15))
	}
	h.exec("ip", "link", "set", "lo", "up")
	pushFakeSGLang(t, c.Client, h.name)
	return h, engine
}

func (h *ctrSrvHarness) engine(withServer bool, vars ...string) *agent.Engine {
	h.t.Helper()
	src := ctrSrvContainer
	if withServer {
		src += ctrSrvServer
	}
	vars = append([]string{"incus_socket=" + h.d.Socket, "name=" + h.name, "hport=" + strconv.Itoa(h.hport), "port=" + strconv.Itoa(h.port)}, vars...)
	return restest.Engine(h.t, h.dir, src, kindsFor(resources.Machine{GPU: restest.A6000}), h.store, agent.Options{StepTimeout: 2 * time.Minute}, vars...)
}

// step returns the server's step of a report.
func (h *ctrSrvHarness) step(rep *agent.Report) *agent.Step {
	h.t.Helper()
	for _, st := range rep.Steps {
		if st.Addr == "server.qwen" {
			return st
		}
	}
	h.t.Fatalf("no server step in %+v", rep.Steps)
	return nil
}

func (h *ctrSrvHarness) plan(vars ...string) *agent.Step {
	h.t.Helper()
	return h.step(h.engine(true, vars...).Plan(context.Background()))
}

func (h *ctrSrvHarness) apply(vars ...string) *agent.Step {
	h.t.Helper()
	return h.step(h.engine(true, vars...).Apply(context.Background(), nil))
}

func (h *ctrSrvHarness) status(vars ...string) *agent.Step {
	h.t.Helper()
	return h.step(h.engine(true, vars...).Status(context.Background()))
}

// exec runs a command inside and returns its stdout (failing on a non-zero exit).
func (h *ctrSrvHarness) exec(argv ...string) string {
	h.t.Helper()
	res, err := h.d.Client.Exec(context.Background(), h.name, incus.ExecRequest{Command: argv})
	if err != nil {
		h.t.Fatal(err)
	}
	if res.ExitCode != 0 {
		h.t.Fatalf("%q inside: exit %d: %s", argv, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func (h *ctrSrvHarness) initPID() int {
	h.t.Helper()
	st, err := h.d.Client.InstanceState(context.Background(), h.name)
	if err != nil {
		h.t.Fatal(err)
	}
	return int(st.Pid)
}

// marked returns the live (not zombie) host processes that carry marker.
func marked(marker string) []proc.Identity {
	all, _ := proc.FS{}.All()
	var out []proc.Identity
	for _, s := range all {
		if s.Dead() {
			continue
		}
		if env, err := (proc.FS{}).Environ(s.PID); err == nil && slices.Contains(env, marker) {
			out = append(out, s.Identity())
		}
	}
	return out
}

// TestServerInContainer: the fake SGLang pushed into a busybox container, launched
// there with the verified lifecycle and reached through a proxy device; every later
// run is a fresh engine (an agent restart) and leaves a healthy server alone; a flag
// change relaunches exactly once; a server that ignores SIGTERM and has children in
// and out of its session is stopped, verified; an OOM launch is quoted from its own
// log inside the container; a stopped container is an error, not a guess.
func TestServerInContainer(t *testing.T) {
	t.Parallel()
	h := newCtrSrvHarness(t)
	ctx := context.Background()

	// The container first (it is what the server depends on), then the program in it.
	if st := h.engine(false).Apply(ctx, nil).Steps[0]; st.Err != nil {
		t.Fatalf("container apply: %v\n%s", st.Err, h.d.LogTail(20))
	}
	// The test image's init leaves the loopback interface down (a real distribution's
	// brings it up); the proxy device connects to 127.0.0.1 inside.
	h.exec("ip", "link", "set", "lo", "up")
	// Before the program is there, the plan already works.
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.Create {
		t.Fatalf("first plan: %v %+v", st.Err, st.Diff)
	}
	pushFakeSGLang(t, h.d.Client, h.name)

	// Launch: recorded with its host PID and start time, its own session and group.
	mustOK(t, h.apply())
	first := h.record()
	if first.Generation != 1 || first.Place != "container "+h.name || first.LogPath != "/var/log/agent/qwen.1.log" ||
		first.PGID != first.PID || first.SID != first.PID {
		t.Fatalf("record = %+v", first)
	}
	fs := proc.FS{}
	if argv, err := fs.Cmdline(first.PID); err != nil || !slices.Equal(argv, first.Argv) {
		t.Errorf("host pid %d runs %q, want the exact argv %q (%v)", first.PID, argv, first.Argv, err)
	}
	if !slices.Contains(first.Argv, `it's "$(touch /pwned)" `+"`id`"+` ; $HOME * \`) {
		t.Errorf("argv lost its metacharacters: %q", first.Argv)
	}
	env, err := fs.Environ(first.PID)
	if err != nil {
		t.Fatal(err)
	}
	wantEnv := []string{"FAKE_SGLANG=", "FAKE_SGLANG_DECODE_INTERVAL=100ms", "FLASHINFER_WORKSPACE_BASE=/root", "HOME=/root",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TORCHINDUCTOR_CACHE_DIR=/root/.cache/torchinductor",
		"TRITON_CACHE_DIR=/root/.cache/triton", "WEIRD=a b'c\"$(touch /pwned) ; *\nline2", first.Marker}
	// The launch's owner (the state directory's identity, issue 27) leads the sorted list.
	if len(env) > 0 && strings.HasPrefix(env[0], "AGENT_OWNER=") && strings.HasSuffix(env[0], ":"+h.store.Dir()) {
		wantEnv = append([]string{env[0]}, wantEnv...)
	}
	if !slices.Equal(env, wantEnv) {
		t.Errorf("environment inside = %q, want exactly %q", env, wantEnv)
	}
	if res, _ := h.d.Client.Exec(ctx, h.name, incus.ExecRequest{Command: []string{"test", "-e", "/pwned"}}); res == nil || res.ExitCode == 0 {
		t.Error("a value was interpreted by a shell: /pwned exists")
	}
	// The host sees it as a process of the container: its PID namespace is the init's,
	// and inside it has another PID. Its parent is the container's init, not incusd's
	// exec: an agent or incusd restart does not touch it.
	init := h.initPID()
	ids, err := fs.NSpid(first.PID)
	if err != nil || len(ids) != 2 {
		t.Errorf("NSpid(%d) = %v, %v", first.PID, ids, err)
	} else if inside := strings.TrimSpace(h.exec("cat", fmt.Sprintf("/proc/%d/stat", ids[1]))); !strings.HasPrefix(inside, strconv.Itoa(ids[1])+" (fake-sglang)") {
		t.Errorf("pid %d inside is %q", ids[1], inside)
	}
	if st, _ := fs.Stat(first.PID); st.PPID != init {
		t.Errorf("parent of pid %d is %d, want the container's init %d", first.PID, st.PPID, init)
	}
	// Its log is inside the container, with the link; the proxy reaches it.
	if log := h.exec("cat", "/var/log/agent/qwen.log"); !strings.Contains(log, "fired up and ready to roll") {
		t.Errorf("log inside:\n%s", log)
	}
	if got := strings.TrimSpace(h.exec("readlink", "/var/log/agent/qwen.log")); got != "qwen.1.log" {
		t.Errorf("qwen.log -> %q", got)
	}
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", h.hport)); err != nil || resp.StatusCode != 200 {
		t.Errorf("GET /health through the proxy: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// A fresh agent: no change, no signal, same PID and start time.
	mustLeaveAlone(t, h.plan, h.apply, h.record, first)
	st := h.status()
	mustOK(t, st)
	if !st.Status.Healthy || fieldOf(st.Status, "accept rate") != "0.97" || fieldOf(st.Status, "generation") != "1" ||
		fieldOf(st.Status, "container") != h.name || fieldOf(st.Status, "log") != "/var/log/agent/qwen.1.log" ||
		!strings.Contains(fieldOf(st.Status, "smoke test"), "passed") || fieldOf(st.Status, "/metrics requests") == "" {
		t.Errorf("status = %+v", st.Status)
	}

	// A changed flag: one verified relaunch, generation 2, its own log inside.
	step := h.plan("mem=0.85")
	if step.Err != nil || step.Diff.Action != agent.Restart || len(step.Diff.Changes) != 1 ||
		step.Diff.Changes[0].Attr != `flags["mem-fraction-static"]` {
		t.Fatalf("plan: %v %+v", step.Err, step.Diff)
	}
	mustOK(t, h.apply("mem=0.85"))
	second := h.record()
	if second.Generation != 2 || second.id() == first.id() || alive(first.id()) || !alive(second.id()) || second.LogPath != "/var/log/agent/qwen.2.log" {
		t.Fatalf("relaunch: first %v (alive %v), second %+v", first.id(), alive(first.id()), second)
	}
	mustOK(t, h.apply("mem=0.85"))
	if r := h.record(); r.id() != second.id() {
		t.Errorf("relaunched more than once: %+v", r)
	}
	if got := strings.TrimSpace(h.exec("readlink", "/var/log/agent/qwen.log")); got != "qwen.2.log" {
		t.Errorf("qwen.log -> %q", got)
	}
	if log := h.exec("cat", "/var/log/agent/qwen.1.log"); !strings.Contains(log, "fired up") {
		t.Error("generation 1's log was not kept")
	}

	// A server that ignores SIGTERM, with children in its group and one in a session
	// of its own: the relaunch stops every one of them, escalated and verified.
	faults := "faults=ignore-sigterm,children=2,setsid-child"
	mustOK(t, h.apply("mem=0.85", faults))
	third := h.record()
	family := marked(third.Marker)
	if third.Generation != 3 || len(family) < 4 {
		t.Fatalf("generation 3 = %+v with %d processes", third, len(family))
	}
	start := time.Now()
	mustOK(t, h.apply("mem=0.8", faults))
	if left := marked(third.Marker); len(left) > 0 {
		t.Errorf("processes of generation 3 survived its stop: %v", left)
	}
	if time.Since(start) < time.Second {
		t.Error("the stop did not wait for SIGTERM before SIGKILL")
	}
	fourth := h.record()
	if fourth.Generation != 4 || !alive(fourth.id()) {
		t.Fatalf("generation 4 = %+v", fourth)
	}

	// An OOM at launch: the error quotes that generation's log, inside the container,
	// and generation 4's command line serves again (issue 25).
	oom := h.apply("faults=oom")
	if oom.Err == nil {
		t.Fatal("an OOM launch applied without error")
	}
	msg := oom.Err.Error()
	for _, want := range []string{"generation 5 failed (out of GPU memory", "CUDA out of memory",
		"rolled back to generation 4's command line, verified, serving (generation 6"} {
		if !strings.Contains(msg, want) {
			t.Errorf("apply error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "fired up") {
		t.Errorf("the error quotes another generation's lines:\n%s", msg)
	}
	if alive(fourth.id()) {
		t.Error("generation 4 survived its relaunch")
	}
	s := h.status("faults=oom")
	mustOK(t, s)
	if s.Status.Healthy || !strings.Contains(s.Status.Summary, "the plan's generation 5 was rolled back") || !strings.Contains(s.Status.Summary, "out of GPU memory") || fieldOf(s.Status, "generation") != "6" {
		t.Errorf("status = %+v", s.Status)
	}

	// Back to the plan's defaults (generation 4 ignored SIGTERM: a relaunch, generation
	// 7), then the container stops: the plan says so instead of guessing.
	mustOK(t, h.apply())
	if r := h.record(); r.Generation != 7 || !alive(r.id()) {
		t.Fatalf("generation 7 = %+v", r)
	}
	if err := h.d.Client.Stop(ctx, h.name, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if st := h.plan(); st.Err == nil || !strings.Contains(st.Err.Error(), "is stopped") {
		t.Errorf("plan with the container stopped: %v", st.Err)
	}
}

// TestServerInContainerForeignAndAdopted: a process the agent did not start holding
// the port inside the container (seen in the container's network namespace, named by
// its host PID) is never signalled; one running exactly the declared command line is
// adopted with its host PID, not restarted.
func TestServerInContainerForeignAndAdopted(t *testing.T) {
	t.Parallel()
	h := newCtrSrvHarness(t)
	ctx := context.Background()
	if st := h.engine(false).Apply(ctx, nil).Steps[0]; st.Err != nil {
		t.Fatalf("container apply: %v", st.Err)
	}
	h.exec("ip", "link", "set", "lo", "up")
	pushFakeSGLang(t, h.d.Client, h.name)
	detached := func(env map[string]string, argv ...string) {
		t.Helper()
		cmd := append([]string{"sh", "-c", `setsid "$@" </dev/null >/dev/null 2>&1 &`, "sh"}, argv...)
		res, err := h.d.Client.Exec(ctx, h.name, incus.ExecRequest{Command: cmd, Env: env})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("start %q inside: %v %+v", argv, err, res)
		}
	}
	owner := func() proc.Identity {
		t.Helper()
		for range 200 {
			if pids, _ := (proc.FS{}).PortOwnersIn(h.initPID(), h.port); len(pids) > 0 {
				if id, err := (proc.FS{}).Identify(pids[0]); err == nil {
					return id
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("nothing listens on %d inside", h.port)
		return proc.Identity{}
	}

	detached(nil, "fake-sglang", "--model-path", "someone/else", "--port", strconv.Itoa(h.port))
	foreign := owner()
	for _, st := range []*agent.Step{h.plan(), h.apply()} {
		if st.Err == nil || !strings.Contains(st.Err.Error(), fmt.Sprintf("held by pid %d", foreign.PID)) || !strings.Contains(st.Err.Error(), "someone/else") {
			t.Errorf("err = %v", st.Err)
		}
	}
	if !alive(foreign) {
		t.Fatal("the foreign process was signalled without takeover")
	}
	_ = syscall.Kill(foreign.PID, syscall.SIGKILL) // the test's own cleanup, by PID

	// The exact command line, started by hand inside: adopted, not restarted.
	if err := (proc.FS{}).PortFreeIn(ctx, h.initPID(), h.port, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	mustOK(t, h.apply())
	launched := h.record()
	h.kill()
	if err := h.store.Delete("server.qwen"); err != nil {
		t.Fatal(err)
	}
	detached(map[string]string{"FAKE_SGLANG": "", "FAKE_SGLANG_DECODE_INTERVAL": "100ms", "WEIRD": "a b'c\"$(touch /pwned) ; *\nline2"}, launched.Argv...)
	own := owner()
	t.Cleanup(func() { _ = syscall.Kill(own.PID, syscall.SIGKILL) })
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.Adopt || !strings.Contains(st.Diff.Changes[0].Note, "adopt pid") {
		t.Fatalf("plan: %v %+v", st.Err, st.Diff)
	}
	mustOK(t, h.apply())
	if r := h.record(); r.id() != own || !r.Adopted || !alive(own) {
		t.Errorf("record = %+v, want the adopted %v", r, own)
	}
	if st := h.plan(); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Errorf("plan after adoption: %v %+v", st.Err, st.Diff)
	}
}
