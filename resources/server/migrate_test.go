package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/container"
	"github.com/agent-dev/agent/resources/restest"
)

// migratePlan is a container with the fake server in it. The fake comes from a host
// directory (a disk device: the member's path, as a model's weights would), so a new
// instance built from the image has it too; the proxy listens on the member's own
// loopback address (members of the test cluster share this host). Its settle is 1 s
// rather than the default 3 s, as ctrSrvServer's.
const migratePlan = `
variable "incus_socket" {}
variable "name" {}
variable "target" {}
variable "listen" {}
variable "bin" {}
variable "hport" { type = number }
variable "port" { type = number }
variable "faults" { default = "" }
agent { incus_socket = var.incus_socket }

container "c" {
  name         = var.name
  image        = "busybox"
  target       = var.target
  stop_timeout = "10s"
  disk "bin" {
    source   = var.bin
    path     = "/opt/agent"
    readonly = true
  }
  device "api" {
    type    = "proxy"
    options = { listen = "tcp:${var.listen}:${var.hport}", connect = "tcp:127.0.0.1:${var.port}" }
  }
}

server "qwen" {
  container = container.c.name
  command   = ["/opt/agent/fake-sglang"]
  flags = {
    "model-path" = "Qwen/Qwen3-8B"
    "port"       = var.port
  }
  env  = { FAKE_SGLANG = var.faults }
  port = var.port
  ready {
    http    = "/health"
    timeout = "20s"
    settle  = "1s"
  }
  stop { timeout = "2s" }
  smoke_test {
    prompt     = "What is 2+2? Answer with one number."
    max_tokens = 64
    expect     = "4"
  }
}
`

// memberIP is the loopback address of a test cluster member (m1 127.0.0.2, …).
func memberIP(m string) string {
	n, _ := strconv.Atoi(strings.TrimPrefix(m, "m"))
	return fmt.Sprintf("127.0.0.%d", n+1)
}

type migrateHarness struct {
	srvState
	c           *incustest.Cluster
	name, bin   string
	hport, port int
}

func newMigrateHarness(t *testing.T, c *incustest.Cluster) *migrateHarness {
	t.Helper()
	h := &migrateHarness{srvState: newSrvState(t), c: c, name: c.InstanceName(t), hport: srvFreePort(t), port: 30000}
	t.Cleanup(func() { restest.RemoveInstance(t, c.Client, h.name+"-b") })
	// The directory of the fake, readable by the container's root (an unprivileged
	// container maps it to another uid): not under the test's 0700 temporary directory.
	dir := restest.ReachableDir(t)
	src, err := os.ReadFile(staticFakeSGLang(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fake-sglang"), src, 0o755); err != nil {
		t.Fatal(err)
	}
	h.bin = dir
	return h
}

func (h *migrateHarness) engine(member string, vars ...string) *agent.Engine {
	h.t.Helper()
	vars = append([]string{"incus_socket=" + h.c.Socket, "name=" + h.name, "target=" + member, "listen=" + memberIP(member),
		"bin=" + h.bin, "hport=" + strconv.Itoa(h.hport), "port=" + strconv.Itoa(h.port)}, vars...)
	return restest.Engine(h.t, h.dir, migratePlan, kindsFor(resources.Machine{GPU: restest.A6000}), h.store, agent.Options{StepTimeout: 2 * time.Minute}, vars...)
}

// healthy reports whether the server answers /health through member's proxy.
func (h *migrateHarness) healthy(member string) bool {
	cl := &http.Client{Timeout: 3 * time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://%s:%d/health", memberIP(member), h.hport))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

func (h *migrateHarness) ctrRecord() container.Record {
	h.t.Helper()
	var r container.Record
	if ok, err := h.store.Load("container.c", &r); !ok || err != nil {
		h.t.Fatalf("no container record: %v", err)
	}
	return r
}

// exists reports whether the instance exists, and its member.
func (h *migrateHarness) exists(name string) (bool, string) {
	h.t.Helper()
	inst, _, err := h.c.Client.GetInstance(context.Background(), name)
	if incus.IsNotFound(err) {
		return false, ""
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return true, inst.Location
}

// applyOK applies and fails the test on any failed step.
func (h *migrateHarness) applyOK(member string, onEvent func(agent.Event), vars ...string) *agent.Report {
	h.t.Helper()
	rep := h.engine(member, vars...).Apply(context.Background(), onEvent)
	for _, st := range rep.Steps {
		if st.Err != nil {
			h.t.Fatalf("apply on %s: %s: %v\n%s", member, st.Addr, st.Err, h.c.LogTail(10))
		}
	}
	return rep
}

// running reports whether rec's process runs, looked at inside its instance (the
// servers of these tests run on members the agent reaches through the Incus API: their
// PIDs are the container's).
func (h *migrateHarness) running(rec serverRecord) bool {
	h.t.Helper()
	name, ok := strings.CutPrefix(rec.Place, lifecycle.IncusPlace(""))
	if !ok || rec.PID <= 0 {
		return false
	}
	res, err := h.c.Client.Exec(context.Background(), name, incus.ExecRequest{Command: []string{"sh", "-c", `read -r s </proc/$1/stat 2>/dev/null && echo "$s" || true`, "x", strconv.Itoa(rec.PID)}})
	if err != nil || res.ExitCode != 0 {
		return false // no instance, or not running: nothing runs in it
	}
	out := string(res.Stdout)
	f := strings.Fields(out[strings.LastIndex(out, ")")+1:])
	return len(f) > 19 && f[19] == strconv.FormatUint(rec.StartTicks, 10) && f[0] != "Z"
}

// TestMigrateMakeBeforeBreak: a running container with a server in it, target m2 → m3,
// in one apply: the new instance on m3 (the pair name), the server launched there and
// verified (ready, smoke test) while the old server and instance still serve, and only
// then the old server stopped (verified) and the old instance deleted (verified gone).
// The order is read from the apply's events and the records at each, never from sleeps.
func TestMigrateMakeBeforeBreak(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newMigrateHarness(t, c)
	ctx := context.Background()
	h.applyOK("m2", nil)
	old := h.record()
	if ok, loc := h.exists(h.name); !ok || loc != "m2" || !h.running(old) || !h.healthy("m2") {
		t.Fatalf("before: instance on %q, record %+v, healthy %v", loc, old, h.healthy("m2"))
	}

	p := h.engine("m3").Plan(ctx)
	ctr := p.Steps[0]
	if ctr.Addr != "container.c" || ctr.Err != nil || ctr.Diff.Action != agent.Replace {
		t.Fatalf("plan: %s %v %+v", ctr.Addr, ctr.Err, ctr.Diff)
	}
	if ch := ctr.Diff.Changes[0]; ch.Attr != "target" || ch.Reason != agent.ReasonMigrate || !strings.Contains(ch.Note, "make before break") {
		t.Fatalf("plan's target change: %+v", ch)
	}

	// At each event, what serves: the old server must run until the new one verified.
	var order []string
	var oldAliveWhenNewVerified, oldInstanceWhenNewVerified bool
	began := time.Now()
	h.applyOK("m3", func(ev agent.Event) {
		order = append(order, string(ev.Phase)+" "+ev.Step.Addr)
		if ev.Phase == "done" && ev.Step.Addr == "server.qwen" {
			oldAliveWhenNewVerified = h.running(old) && h.healthy("m2")
			oldInstanceWhenNewVerified, _ = h.exists(h.name)
		}
	})
	want := []string{"start container.c", "done container.c", "start server.qwen", "done server.qwen", "finished server.qwen", "finished container.c"}
	if strings.Join(order, ", ") != strings.Join(want, ", ") {
		t.Errorf("events %v, want %v", order, want)
	}
	t.Logf("the migration's apply took %s", time.Since(began).Round(100*time.Millisecond))
	if !oldAliveWhenNewVerified || !oldInstanceWhenNewVerified {
		t.Errorf("when the new server was verified, the old one served: %v, its instance existed: %v (make before break)", oldAliveWhenNewVerified, oldInstanceWhenNewVerified)
	}

	// After: one instance, the pair, on m3; the server there, verified; the old gone.
	rec := h.ctrRecord()
	if rec.Instance != h.name+"-b" || rec.Base != h.name || rec.Retiring != "" || rec.Building != "" {
		t.Errorf("container record %+v", rec)
	}
	if ok, loc := h.exists(h.name + "-b"); !ok || loc != "m3" {
		t.Errorf("new instance: exists %v on %q", ok, loc)
	}
	if ok, _ := h.exists(h.name); ok {
		t.Errorf("old instance %s still exists", h.name)
	}
	now := h.record()
	if now.Place != lifecycle.IncusPlace(h.name+"-b") || now.Generation != old.Generation+1 || now.VerifiedAt.IsZero() || now.Retiring != nil || !h.running(now) {
		t.Errorf("server record %+v", now)
	}
	if h.running(old) {
		t.Errorf("the old server (pid %d) still runs", old.PID)
	}
	if !h.healthy("m3") {
		t.Error("the server does not answer through m3's proxy")
	}
	for _, st := range h.engine("m3").Plan(ctx).Steps {
		if st.Err != nil || st.Diff.Action != agent.NoOp {
			t.Errorf("plan after the migration: %s %v %+v", st.Addr, st.Err, st.Diff)
		}
	}
	for _, st := range h.engine("m3").Status(ctx).Steps {
		if st.Err != nil || !st.Status.Healthy || st.Status.Member() != "m3" {
			t.Errorf("status after the migration: %s %v %+v", st.Addr, st.Err, st.Status)
		}
	}

	// And back: the pair alternates, to the plan's name again.
	h.applyOK("m2", nil)
	if rec := h.ctrRecord(); rec.Instance != h.name || rec.Retiring != "" {
		t.Errorf("after the way back: %+v", rec)
	}
	if ok, loc := h.exists(h.name); !ok || loc != "m2" {
		t.Errorf("back: %s exists %v on %q", h.name, ok, loc)
	}
	if ok, _ := h.exists(h.name + "-b"); ok {
		t.Errorf("back: %s-b still exists", h.name)
	}
	if !h.healthy("m2") {
		t.Error("the server does not answer through m2's proxy after the way back")
	}
}

// TestMigrateFailureLeavesTheOldServing: the server fails to become ready in the new
// instance: the apply fails naming it, the old server and the old instance keep
// serving; the next apply (the fault gone) resumes and finishes the migration.
func TestMigrateFailureLeavesTheOldServing(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newMigrateHarness(t, c)
	ctx := context.Background()
	h.applyOK("m2", nil)
	old := h.record()

	rep := h.engine("m3", "faults=exit-on-start").Apply(ctx, nil)
	var srvErr error
	for _, st := range rep.Steps {
		switch st.Addr {
		case "container.c":
			if st.Err != nil || st.Finished != "" || st.Diff == nil || len(st.Diff.Warnings) == 0 || !strings.Contains(strings.Join(st.Diff.Warnings, "\n"), "server.qwen") {
				t.Errorf("container step: err %v, finished %q, diff %+v", st.Err, st.Finished, st.Diff)
			}
		case "server.qwen":
			srvErr = st.Err
		}
	}
	if srvErr == nil || !strings.HasPrefix(srvErr.Error(), "server.qwen") {
		t.Fatalf("server step error = %v, want a failure naming server.qwen", srvErr)
	}
	t.Logf("failed as it should: %v", srvErr)
	if !h.running(old) || !h.healthy("m2") {
		t.Fatal("the old server stopped serving after a failed migration")
	}
	if ok, loc := h.exists(h.name); !ok || loc != "m2" {
		t.Fatalf("old instance: exists %v on %q", ok, loc)
	}
	if r := h.record(); r.Retiring == nil || r.Retiring.PID != old.PID {
		t.Errorf("the record lost the old server: %+v", r)
	}

	// The fault fixed: the next apply converges, exactly one instance left, on m3.
	h.applyOK("m3", nil)
	if ok, _ := h.exists(h.name); ok {
		t.Error("old instance still exists after the resumed migration")
	}
	if ok, loc := h.exists(h.name + "-b"); !ok || loc != "m3" {
		t.Errorf("new instance: exists %v on %q", ok, loc)
	}
	if h.running(old) || !h.healthy("m3") {
		t.Errorf("after the resume: old alive %v, new healthy %v", h.running(old), h.healthy("m3"))
	}
}

// TestMigrateSurvivesSIGKILL: `agent apply` (the real binary) migrating a container with
// a server in it is SIGKILLed at each step of the migration in turn (the intent to
// build the pair, the pair live, the new server launched, each finish); after every
// kill something still serves, and the next apply resumes from the records. The last
// apply converges with exactly one instance left, on the new member, its server ready.
func TestMigrateSurvivesSIGKILL(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newMigrateHarness(t, c)
	h.applyOK("m2", nil)
	old := h.record()

	planDir := restest.ReachableDir(t)
	if err := os.WriteFile(filepath.Join(planDir, "plan.hcl"), []byte(migratePlan), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"apply", planDir, "--state-dir", h.store.Dir(), "--log-level", "info", "--lock-timeout", "0",
		"-var", "incus_socket=" + c.Socket, "-var", "name=" + h.name, "-var", "target=m3", "-var", "listen=" + memberIP("m3"),
		"-var", "bin=" + h.bin, "-var", "hport=" + strconv.Itoa(h.hport), "-var", "port=" + strconv.Itoa(h.port)}
	bin := testbin.Agent(t)
	// apply runs the agent; with a marker, it SIGKILLs it as soon as a line of its log
	// has all of the marker's parts, and reports whether it did.
	apply := func(marker ...string) (killed bool, out string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		var buf bytes.Buffer
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&buf, pw), io.MultiWriter(&buf, pw)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGKILL) }) // by PID: this test's agent
		// seen says whether it killed, once the output is read to its end.
		seen := make(chan bool, 1)
		go func() {
			hit := false
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				if len(marker) > 0 && containsAll(sc.Text(), marker) {
					hit = true
					_ = cmd.Process.Signal(syscall.SIGKILL)
					break
				}
			}
			_, _ = io.Copy(io.Discard, pr)
			seen <- hit
		}()
		err := cmd.Wait()
		pw.Close()
		killed = <-seen
		if !killed && err != nil {
			t.Fatalf("agent apply (marker %q): %v\n%s", marker, err, buf.String())
		}
		return killed, buf.String()
	}
	for _, marker := range [][]string{
		{`msg="migrating: building the new instance"`},
		{`msg="migrating: new instance live`},
		{`msg=launched`},
		{`msg=finishing`, "resource=server.qwen"},
		{`msg=finishing`, "resource=container.c"},
	} {
		killed, out := apply(marker...)
		t.Logf("killed at %q: %v", marker, killed)
		if !killed {
			// The step was passed by an earlier apply (it resumed beyond it): fine, but
			// then this one converged.
			if !strings.Contains(out, "Apply complete") && !strings.Contains(out, "No changes") {
				t.Fatalf("apply not killed at %q and not converged:\n%s", marker, out)
			}
			continue
		}
		if !h.healthy("m2") && !h.healthy("m3") {
			t.Fatalf("killed at %q: nothing serves\n%s", marker, out)
		}
	}
	if _, out := apply(); !strings.Contains(out, "Apply complete") && !strings.Contains(out, "No changes") {
		t.Fatalf("last apply:\n%s", out)
	}
	if ok, _ := h.exists(h.name); ok {
		t.Error("old instance still exists")
	}
	if ok, loc := h.exists(h.name + "-b"); !ok || loc != "m3" {
		t.Errorf("new instance: exists %v on %q", ok, loc)
	}
	now := h.record()
	if now.Place != lifecycle.IncusPlace(h.name+"-b") || now.Retiring != nil || now.Pending != nil || !h.running(now) || !h.healthy("m3") {
		t.Errorf("server after the last apply: %+v (healthy %v)", now, h.healthy("m3"))
	}
	if rec := h.ctrRecord(); rec.Retiring != "" || rec.Building != "" || rec.Instance != h.name+"-b" {
		t.Errorf("container record %+v", rec)
	}
	if h.running(old) {
		t.Errorf("the first server (pid %d) still runs", old.PID)
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// TestServerInContainerOnClusterMember: the verified launch, readiness, smoke test and
// relaunch of a server in a container on m2, all through m1's socket.
func TestServerInContainerOnClusterMember(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h, on := onMember2(t, c, c.Socket, resources.Machine{GPU: restest.A6000})
	engine := func(vars ...string) *agent.Engine { return on(resources.Machine{GPU: restest.A6000}, vars...) }
	ctx := context.Background()
	rep := engine().Apply(ctx, nil)
	for _, st := range rep.Steps {
		if st.Err != nil {
			t.Fatalf("%s: %v\n%s", st.Addr, st.Err, c.LogTail(15))
		}
	}
	inst, _, err := c.Client.GetInstance(context.Background(), h.name)
	if err != nil || inst.Location != "m2" {
		t.Fatalf("instance location %v %v", inst, err)
	}
	st := h.step(engine().Status(context.Background()))
	if st.Err != nil || !st.Status.Healthy || st.Status.Member() != "m2" {
		t.Fatalf("server status: %v %+v", st.Err, st.Status)
	}
	if p := h.step(engine().Plan(context.Background())); p.Err != nil || p.Diff.Action != agent.NoOp {
		t.Fatalf("plan after apply: %v %+v", p.Err, p.Diff)
	}
	gen := restest.Field(st.Status, "generation")
	st = h.step(engine("mem=0.7").Apply(context.Background(), nil))
	if st.Err != nil {
		t.Fatalf("relaunch on m2: %v", st.Err)
	}
	st = h.step(engine("mem=0.7").Status(context.Background()))
	if st.Err != nil || !st.Status.Healthy || restest.Field(st.Status, "generation") == gen {
		t.Fatalf("after the relaunch: generation %q (was %q): %v %+v", restest.Field(st.Status, "generation"), gen, st.Err, st.Status)
	}
}
