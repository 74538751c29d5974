package container

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
	"github.com/agent-dev/agent/resources/server"
	"github.com/google/go-cmp/cmp"
)

// incusd is this test binary's private Incus daemon, started by the first test that
// needs it.
var incusd = incustest.NewShared()

// kindsFor is the kinds a container test's plans declare, the container and the
// servers it may hold, wired as resources/registry wires them (which this package's
// tests cannot import: it imports this package).
func kindsFor(h resources.Machine) []agent.Kind {
	h = h.WithDefaults()
	h.Containers, h.Servers = ContainerPeers{}, server.ServerPeers{}
	return []agent.Kind{ContainerKind(h), server.ServerKind(h)}
}

func TestMain(m *testing.M) {
	restest.WaitingParallel(restest.WaitingTests)
	os.Exit(incusCluster.Done(incusd.Run(m)))
}

// ctrHarness runs plans for one container against the private daemon, with one state
// store across runs, as successive `agent apply` runs on one host would.
type ctrHarness struct {
	t     *testing.T
	d     *incustest.Daemon
	dir   string
	store *state.Store
	name  string
}

func newCtrHarness(t *testing.T) *ctrHarness {
	t.Helper()
	d := incusd.Start(t)
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, ".state"))
	if err != nil {
		t.Fatal(err)
	}
	return &ctrHarness{t: t, d: d, dir: dir, store: store, name: d.InstanceName(t)}
}

// plan binds a container block body (the instance name and the socket are filled in).
func (h *ctrHarness) engine(body string) *agent.Engine {
	h.t.Helper()
	src := fmt.Sprintf(`
variable "incus_socket" {}
agent { incus_socket = var.incus_socket }
container "c" {
  name = %q
%s
}
`, h.name, body)
	return restest.Engine(h.t, h.dir, src, kindsFor(resources.Machine{GPU: restest.A6000}), h.store, agent.Options{StepTimeout: time.Minute}, "incus_socket="+h.d.Socket)
}

// plan returns the container's diff (failing on an error).
func (h *ctrHarness) plan(body string) *agent.Diff {
	h.t.Helper()
	rep := h.engine(body).Plan(context.Background())
	if st := rep.Steps[0]; st.Err != nil {
		h.t.Fatalf("plan: %v", st.Err)
	}
	return rep.Steps[0].Diff
}

// apply applies and requires success and a no-op plan afterwards; it returns the diff
// that was applied.
func (h *ctrHarness) apply(body string) *agent.Diff {
	h.t.Helper()
	e := h.engine(body)
	rep := e.Apply(context.Background(), nil)
	st := rep.Steps[0]
	if st.Err != nil {
		h.t.Fatalf("apply: %v\n%s", st.Err, h.d.LogTail(15))
	}
	again := e.Plan(context.Background()).Steps[0]
	if again.Err != nil || again.Diff.Action != agent.NoOp {
		h.t.Fatalf("second plan is not a no-op: %v %+v", again.Err, again.Diff)
	}
	return st.Diff
}

func (h *ctrHarness) inst() (*incus.Instance, string) {
	h.t.Helper()
	inst, etag, err := h.d.Client.GetInstance(context.Background(), h.name)
	if err != nil {
		h.t.Fatal(err)
	}
	return inst, etag
}

func (h *ctrHarness) pid() int64 {
	h.t.Helper()
	st, err := h.d.Client.InstanceState(context.Background(), h.name)
	if err != nil {
		h.t.Fatal(err)
	}
	return st.Pid
}

func (h *ctrHarness) exec(argv ...string) string {
	h.t.Helper()
	res, err := h.d.Client.Exec(context.Background(), h.name, incus.ExecRequest{Command: argv})
	if err != nil {
		h.t.Fatal(err)
	}
	if res.ExitCode != 0 {
		h.t.Fatalf("%v: exit %d: %s", argv, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// hasChange reports whether d changes attr with a note (the kind's, or what its effect
// says: "restart", "forces replacement") that contains note.
func hasChange(d *agent.Diff, attr, note string) bool {
	for _, c := range d.Changes {
		shown := c.Note
		switch c.EffectOf() {
		case agent.Restarts:
			shown += " restart"
		case agent.Replaces:
			shown += " forces replacement"
		}
		if c.Attr == attr && strings.Contains(shown, note) {
			return true
		}
	}
	return false
}

// TestContainerLifecycle: create, a config change applied in place with the ETag and
// the server's keys preserved, a device added live, a restart-only key, a key removed
// when it leaves the plan, a hand-set key left alone; a second plan is a no-op after
// every apply (h.apply checks it).
func TestContainerLifecycle(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	ctx := context.Background()

	base := `  image  = "busybox"
  stop_timeout = "10s"
`
	d := h.apply(base + `  config = { "user.answer" = 42, "user.flag" = true, "limits.processes" = "500" }`)
	if d.Action != agent.Create {
		t.Fatalf("first apply: %s, want create", d.Action)
	}
	inst, _ := h.inst()
	if !inst.Running() || inst.Config["user.answer"] != "42" || inst.Config["user.flag"] != "true" {
		t.Fatalf("created: %s %v", inst.Status, inst.Config)
	}
	if len(inst.Profiles) != 1 || inst.Profiles[0] != "default" {
		t.Errorf("profiles = %v", inst.Profiles)
	}
	uuid, pid := inst.Config["volatile.uuid"], h.pid()

	// In place: a changed value, under the ETag; volatile.* kept, no restart.
	d = h.plan(base + `  config = { "user.answer" = 43, "user.flag" = true, "limits.processes" = "500" }`)
	if d.Action != agent.Update || len(d.Changes) != 1 || d.Changes[0].Attr != `config["user.answer"]` || d.Changes[0].Old != "42" {
		t.Fatalf("config change diff: %s %+v", d.Action, d.Changes)
	}
	_, etagBefore := h.inst()
	h.apply(base + `  config = { "user.answer" = 43, "user.flag" = true, "limits.processes" = "500" }`)
	inst, etagAfter := h.inst()
	if inst.Config["user.answer"] != "43" || inst.Config["volatile.uuid"] != uuid || etagAfter == etagBefore {
		t.Errorf("after update: %v (etag changed %v)", inst.Config, etagAfter != etagBefore)
	}
	if h.pid() != pid {
		t.Error("an in-place config change restarted the instance")
	}

	// A key set by hand is not the plan's business: warned about, kept.
	if err := h.d.Client.PatchInstance(ctx, h.name, incus.InstancePatch{Config: map[string]string{"user.by-hand": "x"}}, ""); err != nil {
		t.Fatal(err)
	}
	// A key that leaves the plan is removed (the state recorded it); a disk is added live.
	models := t.TempDir()
	if err := os.WriteFile(filepath.Join(models, "config.json"), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	withDisk := base + `  config = { "user.answer" = 43, "limits.processes" = "500" }
  disk "models" {
    source   = "` + models + `"
    path     = "/models"
    readonly = true
  }
`
	d = h.plan(withDisk)
	if d.Action != agent.Update || !hasChange(d, `config["user.flag"]`, "") || !hasChange(d, `disk["models"]`, "") {
		t.Fatalf("disk diff: %s %+v", d.Action, d.Changes)
	}
	if len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "config user.by-hand") {
		t.Errorf("warnings = %q, want one naming user.by-hand", d.Warnings)
	}
	h.apply(withDisk)
	inst, _ = h.inst()
	if _, ok := inst.Config["user.flag"]; ok || inst.Config["user.by-hand"] != "x" {
		t.Errorf("after removal: %v", inst.Config)
	}
	if got := h.exec("ls", "/models"); got != "config.json\n" {
		t.Errorf("ls /models inside = %q", got)
	}
	if res, _ := h.d.Client.Exec(ctx, h.name, incus.ExecRequest{Command: []string{"touch", "/models/x"}}); res == nil || res.ExitCode == 0 {
		t.Error("readonly disk is writable inside")
	}
	if h.pid() != pid {
		t.Error("adding a disk restarted the instance")
	}

	// A key LXC reads only at start: a restart, said so in the plan.
	withRaw := strings.Replace(withDisk, `"limits.processes" = "500"`, `"limits.processes" = "500", "raw.lxc" = "lxc.environment = AGENT_TEST=1"`, 1)
	d = h.plan(withRaw)
	if d.Action != agent.Restart || !hasChange(d, `config["raw.lxc"]`, "restart") {
		t.Fatalf("raw.lxc diff: %s %+v", d.Action, d.Changes)
	}
	h.apply(withRaw)
	if h.pid() == pid {
		t.Error("raw.lxc change did not restart the instance")
	}

	// Status: init PID, disks.
	rep := h.engine(withRaw).Status(ctx)
	st := rep.Steps[0].Status
	if st == nil || !st.Healthy {
		t.Fatalf("status: %+v %v", st, rep.Steps[0].Err)
	}
	fields := map[string]string{}
	for _, f := range st.Fields {
		fields[f.Name] = f.Text
	}
	if fields["status"] != "Running" || fields["init_pid"] == "" || !strings.Contains(fields["disks"], models+" → /models (ro)") {
		t.Errorf("status fields: %v", fields)
	}

	// running = false stops it; the plan is then a no-op.
	h.apply(withRaw + "  running = false\n")
	if inst, _ = h.inst(); inst.Running() {
		t.Error("running = false left it running")
	}
}

// TestContainerReplace: an image change is refused without replace = "allowed" (and
// nothing is touched), then carried out with it; the disk's host data survives.
func TestContainerReplace(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	ctx := context.Background()

	// A second image: published from a stopped helper instance.
	helper := h.d.InstanceName(t)
	if err := h.d.Client.CreateInstance(ctx, incus.InstancesPost{Name: helper, Source: incus.InstanceSource{Alias: h.d.Image}}); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Client.PushFile(ctx, helper, "/etc/flavour", strings.NewReader("two\n"), incus.FileInfo{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	alias := "img-" + helper
	var op incus.Operation
	if err := h.d.Client.Query(ctx, "POST", "/1.0/images", map[string]any{
		"source":  map[string]any{"type": "instance", "name": helper},
		"aliases": []map[string]string{{"name": alias}},
	}, &op); err != nil {
		t.Fatal(err)
	}

	data := t.TempDir()
	weights := filepath.Join(data, "weights.bin")
	if err := os.WriteFile(weights, []byte("52 GB of BF16"), 0o644); err != nil {
		t.Fatal(err)
	}
	body := func(image, replace string) string {
		return fmt.Sprintf(`  image = %q
  replace = %q
  stop_timeout = "5s"
  disk "models" {
    source = %q
    path   = "/models"
  }
`, image, replace, data)
	}
	h.apply(body("busybox", "refuse"))
	h.exec("touch", "/root/old-rootfs")
	inst, etag := h.inst()
	uuid := inst.Config["volatile.uuid"]

	rep := h.engine(body(alias, "refuse")).Plan(ctx)
	err := rep.Steps[0].Err
	if err == nil || !strings.Contains(err.Error(), `replace = "allowed"`) || !strings.Contains(err.Error(), "image") || !agent.IsTerminal(err) {
		t.Fatalf("refused replace: got %v", err)
	}
	t.Logf("refused replace: %v", err)
	if rep := h.engine(body(alias, "refuse")).Apply(ctx, nil); rep.Steps[0].Err == nil {
		t.Fatal("apply of a refused replace succeeded")
	}
	if _, etag2 := h.inst(); etag2 != etag {
		t.Error("a refused replace changed the instance")
	}

	d := h.plan(body(alias, "allowed"))
	if d.Action != agent.Replace || !hasChange(d, "image", "forces replacement") {
		t.Fatalf("replace diff: %s %+v", d.Action, d.Changes)
	}
	h.apply(body(alias, "allowed"))
	inst, _ = h.inst()
	if inst.Config["volatile.uuid"] == uuid || !inst.Running() {
		t.Errorf("not replaced: uuid %s, %s", inst.Config["volatile.uuid"], inst.Status)
	}
	if got := h.exec("cat", "/etc/flavour"); got != "two\n" {
		t.Errorf("new image's /etc/flavour = %q", got)
	}
	if res, _ := h.d.Client.Exec(ctx, h.name, incus.ExecRequest{Command: []string{"test", "-e", "/root/old-rootfs"}}); res == nil || res.ExitCode == 0 {
		t.Error("the old root filesystem survived a replace")
	}
	if got, err := os.ReadFile(weights); err != nil || string(got) != "52 GB of BF16" {
		t.Fatalf("host data after replace: %q %v", got, err)
	}
	if got := h.exec("cat", "/models/weights.bin"); got != "52 GB of BF16" {
		t.Errorf("inside after replace: %q", got)
	}
}

// TestContainerGPUMissing: a gpu device naming a PCI address the host lacks fails at
// start with Incus's message and the GPUs the host does have.
func TestContainerGPUMissing(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	body := `  image = "busybox"
  gpu "gpu0" { pci = "7f:1f.7" }
`
	d := h.plan(body)
	found := false
	for _, c := range d.Changes {
		found = found || c.Attr == `gpu["gpu0"]` && agent.Render(c.New) == `gpu {pci = "0000:7f:1f.7"}`
	}
	if !found {
		t.Errorf("gpu diff: %+v", d.Changes)
	}
	rep := h.engine(body).Apply(context.Background(), nil)
	err := rep.Steps[0].Err
	if err == nil {
		t.Fatal("start with a missing GPU succeeded")
	}
	t.Logf("missing GPU: %v", err)
	for _, want := range []string{"Failed to start device \"gpu0\"", "0000:7f:1f.7", "GPUs on this host: pci 0000:01:00.0 (NVIDIA RTX A6000, nvidia-smi index 0)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	// The instance exists, stopped; the next plan still wants it started, no more.
	d = h.plan(body)
	if d.Action != agent.Update || len(d.Changes) != 1 || d.Changes[0].Attr != "running" {
		t.Errorf("plan after the failed start: %s %+v", d.Action, d.Changes)
	}
}

// TestContainerUserspaceAndFiles: exec and file push through the client, and the
// userspace driver check: a libnvidia-ml.so.1 of another version is reported in the
// diff and the apply fails with the fix; the right version is a no-op.
func TestContainerUserspaceAndFiles(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	ctx := context.Background()
	h.apply(`  image = "busybox"` + "\n")

	lib := "/usr/lib/x86_64-linux-gnu"
	if err := h.d.Client.PushFile(ctx, h.name, "/root/libnvidia-ml.so.550.54.14", strings.NewReader("\x7fELF fake"), incus.FileInfo{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	h.exec("sh", "-c", "mkdir -p "+lib+" && mv /root/libnvidia-ml.so.550.54.14 "+lib+"/ && ln -s libnvidia-ml.so.550.54.14 "+lib+"/libnvidia-ml.so.1")
	if got := h.exec("cat", lib+"/libnvidia-ml.so.1"); got != "\x7fELF fake" {
		t.Fatalf("pushed library reads %q", got)
	}

	want := `  image = "busybox"
  nvidia_userspace = "580.95.05"
`
	d := h.plan(want)
	if d.Action != agent.Update || len(d.Changes) != 1 || d.Changes[0].Old != "550.54.14" || d.Changes[0].New != "580.95.05" {
		t.Fatalf("userspace diff: %s %+v", d.Action, d.Changes)
	}
	rep := h.engine(want).Apply(ctx, nil)
	if err := rep.Steps[0].Err; err == nil || !strings.Contains(err.Error(), "--no-kernel-module") || !strings.Contains(err.Error(), "550.54.14") {
		t.Errorf("apply with a mismatched userspace driver: %v", err)
	}
	h.apply(`  image = "busybox"
  nvidia_userspace = "550.54.14"
`)

	// With nvidia_installer, the agent installs the wanted version inside: downloaded and
	// verified, pushed, run with --no-kernel-module, removed, checked. The fake installer
	// records its arguments and installs a library of its version.
	installer := "#!/bin/sh\n" +
		"echo \"$@\" > /root/installer-args\n" +
		"lib=/usr/lib/x86_64-linux-gnu\n" +
		"mkdir -p $lib && : > $lib/libnvidia-ml.so.580.95.05 && ln -sf libnvidia-ml.so.580.95.05 $lib/libnvidia-ml.so.1\n" +
		"echo 'Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: 580.95.05) is now complete.'\n"
	srv := fetchtest.NewServer()
	t.Cleanup(srv.Close)
	srv.Set("/NVIDIA-Linux-x86_64-580.95.05.run", []byte(installer))
	sum := sha256.Sum256([]byte(installer))
	withInstaller := fmt.Sprintf(`  image = "busybox"
  nvidia_userspace = "580.95.05"
  nvidia_installer {
    url    = %q
    sha256 = "%x"
  }
`, srv.URL("/NVIDIA-Linux-x86_64-580.95.05.run"), sum)
	d = h.plan(withInstaller)
	if d.Action != agent.Update || len(d.Changes) != 1 || !strings.Contains(d.Changes[0].Note, "--no-kernel-module") {
		t.Fatalf("plan with an installer: %s %+v", d.Action, d.Changes)
	}
	h.apply(withInstaller) // applies and re-plans as a no-op
	if got := h.exec("cat", "/root/installer-args"); !strings.Contains(got, "--no-kernel-module") || !strings.Contains(got, "--silent") {
		t.Errorf("installer arguments = %q", got)
	}
	if got := h.exec("sh", "-c", "ls /root/*.run 2>/dev/null; true"); strings.TrimSpace(got) != "" {
		t.Errorf("the installer was left inside: %q", got)
	}

	// A wrong checksum runs nothing.
	bad := strings.Replace(withInstaller, fmt.Sprintf("%x", sum), strings.Repeat("0", 64), 1)
	h.exec("sh", "-c", "ln -sf libnvidia-ml.so.550.54.14 "+lib+"/libnvidia-ml.so.1 && rm /root/installer-args")
	rep = h.engine(bad).Apply(ctx, nil)
	if err := rep.Steps[0].Err; err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("apply with a wrong checksum: %v", err)
	}
	if got := h.exec("sh", "-c", "cat /root/installer-args 2>/dev/null; true"); got != "" {
		t.Errorf("an unverified installer ran: %q", got)
	}

	// A stopped instance (a reboot without autostart, an agent killed before the start)
	// cannot be probed by Check: the apply that starts it probes and installs after the
	// start, in the same step (found in review: it started it and failed to converge).
	// Killed, not shut down: the state is what matters, and a clean shutdown under a
	// loaded machine outlasted its 30 s (CI).
	if err := h.d.Client.Kill(ctx, h.name); err != nil {
		t.Fatal(err)
	}
	h.apply(withInstaller) // fails the test unless one apply converges
	if got := h.exec("cat", "/root/installer-args"); !strings.Contains(got, "--no-kernel-module") {
		t.Errorf("installer arguments after the start = %q", got)
	}
}

// TestContainerUnmanagedUntouched: instances the plan does not name are never changed,
// stopped or deleted.
func TestContainerUnmanagedUntouched(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	ctx := context.Background()
	other := h.d.InstanceName(t)
	if err := h.d.Client.CreateInstance(ctx, incus.InstancesPost{Name: other, Source: incus.InstanceSource{Alias: h.d.Image},
		InstancePut: incus.InstancePut{Profiles: []string{"default"}, Config: map[string]string{"user.owner": "someone else"}}}); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Client.Start(ctx, other); err != nil {
		t.Fatal(err)
	}
	_, etag, _ := h.d.Client.GetInstance(ctx, other)
	before, _ := h.d.Client.InstanceState(ctx, other)
	h.apply(`  image = "busybox"` + "\n")
	inst, etag2, err := h.d.Client.GetInstance(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := h.d.Client.InstanceState(ctx, other)
	if etag2 != etag || !inst.Running() || after.Pid != before.Pid {
		t.Errorf("unmanaged instance touched: etag same %v, %s, pid %d → %d", etag2 == etag, inst.Status, before.Pid, after.Pid)
	}
}

// TestContainerBind covers the plan-time checks; no daemon needed.
func TestContainerBind(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, want string }{
		{"privileged nvidia runtime", `image = "u"
  nvidia_runtime = true
  config = { "security.privileged" = true }`, "refuses privileged containers"},
		{"server-owned key", `image = "u"
  config = { "volatile.uuid" = "x" }`, "set by Incus itself"},
		{"replace value", `image = "u"
  replace = "yes"`, `"refuse" (the default) or "allowed"`},
		{"relative disk", `image = "u"
  disk "m" {
    source = "models"
    path = "/models"
  }`, "absolute host directory"},
		{"duplicate device", `image = "u"
  gpu "x" {}
  disk "x" {
    source = "/srv"
    path = "/srv"
  }`, "already declared"},
		{"bad pci", `image = "u"
  gpu "x" { pci = "first" }`, "not a PCI address"},
		{"bad driver version", `image = "u"
  nvidia_userspace = "latest"`, "not an NVIDIA driver version"},
		{"ok", `image = "u"
  config = { "limits.cpu" = 4, "boot.autostart" = false, "limits.memory" = "96GiB" }
  nvidia_runtime = true
  gpu "all" {}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "container \"c\" {\n  " + tc.body + "\n}\n"
			res, diags := restest.BindPlan(src, []agent.Kind{ContainerKind(resources.Machine{})})
			if tc.want == "" {
				if diags.HasErrors() {
					t.Fatal(diags.Error())
				}
				c := res["container.c"].(*Container)
				if c.config["limits.cpu"] != "4" || c.config["boot.autostart"] != "false" || c.config["nvidia.runtime"] != "true" || c.name != "c" {
					t.Errorf("config = %v, name %q", c.config, c.name)
				}
				if dev := c.devices["all"]; len(dev) != 1 || dev["type"] != "gpu" {
					t.Errorf("gpu all = %v", dev)
				}
				return
			}
			if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.want) {
				t.Errorf("diagnostics %v, want %q", diags, tc.want)
			}
		})
	}
}

// TestContainerRemoteImage: a remote the agent does not know is a clear error at plan
// time.
func TestContainerRemoteImage(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	rep := h.engine(`  image = "images:debian/12"` + "\n").Plan(context.Background())
	err := rep.Steps[0].Err
	if err == nil || !strings.Contains(err.Error(), `remote "images", which is not configured`) || !strings.Contains(err.Error(), "incus image copy images:debian/12 local:") {
		t.Errorf("remote image: %v", err)
	}
}

func TestParseUserspace(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"lib libnvidia-ml.so.580.95.05\n": "580.95.05",
		"smi 550.54.14":                   "550.54.14",
		"lib libnvidia-ml.so.1":           "",
		"smi ":                            "",
		"":                                "",
	} {
		if got := parseUserspace(in); got != want {
			t.Errorf("parseUserspace(%q) = %q, want %q", in, got, want)
		}
	}
}

// The record is of one instance. When the plan's name moves to an instance the agent did
// not make, or the agent's instance is deleted and made again by someone else under the
// same name, the keys and devices found there are not the agent's to remove (found in
// review: they were removed as "set by an earlier apply").
func TestContainerRecordIsOfOneInstance(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	ctx := context.Background()
	ours, theirs := t.TempDir(), t.TempDir()
	h.apply(`  image = "busybox"
  config = { "user.owner" = "agent", "user.team" = "ml" }
  disk "data" {
    source = "` + ours + `"
    path   = "/data"
  }` + "\n")

	operators := func(name string) {
		t.Helper()
		if err := h.d.Client.CreateInstance(ctx, incus.InstancesPost{Name: name, Source: incus.InstanceSource{Alias: h.d.Image},
			InstancePut: incus.InstancePut{Profiles: []string{"default"},
				Config:  map[string]string{"user.owner": "operator", "user.team": "ops"},
				Devices: map[string]map[string]string{"data": {"type": "disk", "source": theirs, "path": "/data"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	untouched := func(name string) {
		t.Helper()
		inst, _, err := h.d.Client.GetInstance(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Config["user.owner"] != "operator" || inst.Config["user.team"] != "ops" || inst.Devices["data"]["source"] != theirs {
			t.Errorf("%s: the operator's keys or device were changed: config %v, devices %v", name, inst.Config, inst.Devices)
		}
	}

	// The plan's name moves to an instance the operator made.
	first := h.name
	other := h.d.InstanceName(t)
	operators(other)
	h.name = other
	h.apply(`  image = "busybox"` + "\n")
	untouched(other)

	// The agent's first instance is deleted and made again by the operator.
	h.name = first
	if err := h.d.Client.Stop(ctx, first, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Client.DeleteInstance(ctx, first); err != nil {
		t.Fatal(err)
	}
	operators(first)
	h.apply(`  image = "busybox"` + "\n")
	untouched(first)
}

// A container that installs the userspace driver gets the driver's step budget; others
// keep the engine's default (0).
func TestContainerTimeout(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]time.Duration{
		`image = "u"`: 0,
		`image = "u"
  nvidia_userspace = "580.95.05"
  nvidia_installer {
    url    = "https://example.com/NVIDIA-Linux-x86_64-580.95.05.run"
    sha256 = "` + strings.Repeat("0", 64) + `"
  }`: resources.DriverTimeout,
	} {
		res, diags := restest.BindPlan("container \"c\" {\n  "+body+"\n}\n", []agent.Kind{ContainerKind(resources.Machine{})})
		if diags.HasErrors() {
			t.Fatal(diags.Error())
		}
		if got := res["container.c"].(*Container).Timeout(); got != want {
			t.Errorf("%s: Timeout = %v, want %v", body, got, want)
		}
	}
}

// A secret in one config key hides that key's value alone: the others' values are
// shown as they change.
func TestContainerConfigSecretPerKey(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	engine := func(secret, plain string) *agent.Engine {
		src := fmt.Sprintf(`
variable "incus_socket" {}
variable "secret" {
  default   = %q
  sensitive = true
}
agent { incus_socket = var.incus_socket }
container "c" {
  name         = %q
  image        = "busybox"
  stop_timeout = "10s"
  config       = { "user.secret" = var.secret, "user.plain" = %q }
}
`, secret, h.name, plain)
		return restest.Engine(t, h.dir, src, kindsFor(resources.Machine{GPU: restest.A6000}), h.store, agent.Options{StepTimeout: time.Minute}, "incus_socket="+h.d.Socket)
	}
	sensitivity := func(d *agent.Diff) map[string]bool {
		out := map[string]bool{}
		for _, c := range d.Changes {
			if strings.HasPrefix(c.Attr, "config[") {
				out[c.Attr] = c.Sensitive
			}
		}
		return out
	}
	want := map[string]bool{`config["user.secret"]`: true, `config["user.plain"]`: false}

	e := engine("s3cret-one", "a")
	if d := e.Plan(context.Background()).Steps[0].Diff; !cmp.Equal(sensitivity(d), want) {
		t.Errorf("create: sensitive config changes %v, want %v", sensitivity(d), want)
	}
	if st := e.Apply(context.Background(), nil).Steps[0]; st.Err != nil {
		t.Fatalf("apply: %v\n%s", st.Err, h.d.LogTail(15))
	}
	st := engine("s3cret-two", "b").Plan(context.Background()).Steps[0]
	if st.Err != nil {
		t.Fatal(st.Err)
	}
	if got := sensitivity(st.Diff); !cmp.Equal(got, want) {
		t.Errorf("update: sensitive config changes %v, want %v", got, want)
	}
	for _, c := range st.Diff.Changes {
		if c.Attr == `config["user.plain"]` && (c.Old != "a" || c.New != "b") {
			t.Errorf("the plain key's change is %v → %v, want a → b", c.Old, c.New)
		}
	}
}

// TestContainerCheckWritesNothing: the container's Check writes nothing (issue 24; see
// restest.CheckWritesNothing).
func TestContainerCheckWritesNothing(t *testing.T) {
	t.Parallel()
	h := newCtrHarness(t)
	src := fmt.Sprintf("variable \"incus_socket\" {}\nagent { incus_socket = var.incus_socket }\ncontainer \"c\" {\n  name = %q\n  image = \"busybox\"\n}\n", h.name)
	if d := restest.CheckWritesNothing(t, h.dir, src, kindsFor(resources.Machine{GPU: restest.A6000}), h.store, "container.c", "incus_socket="+h.d.Socket); d.Action != agent.Create {
		t.Errorf("diff %+v, want a create", d)
	}
}
