package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/txtar"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// Fake host trees, unpacked into t.TempDir() (names like gpus/0000:01:00.0 contain
// colons, which a checkout may not hold). A file whose content starts with "symlink "
// becomes a symbolic link to the rest of its first line.
const (
	// tree570 has driver 570.172.08 loaded and installed, two A6000, no nouveau.
	tree570 = `
-- proc/driver/nvidia/version --
NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 18:01:06 UTC 2025
-- sys/module/nvidia/version --
570.172.08
-- proc/driver/nvidia/gpus/0000:01:00.0/information --
Model: 		 NVIDIA RTX A6000
GPU UUID: 	 GPU-6a2e5a62-1f1c-5c3e-9f0a-2d7b8e4c1a01
Bus Location: 	 0000:01:00.0
-- proc/driver/nvidia/gpus/0000:c1:00.0/information --
Model: 		 NVIDIA RTX A6000
GPU UUID: 	 GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02
Bus Location: 	 0000:c1:00.0
-- proc/modules --
nvidia_uvm 1794048 0 - Live 0x0000000000000000
nvidia 11313152 2 nvidia_uvm, Live 0x0000000000000000 (POE)
-- proc/sys/kernel/random/boot_id --
5d1f2a3c-0000-4000-8000-000000000001
-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 --
symlink libnvidia-ml.so.570.172.08
-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.172.08 --
-- usr/bin/apt-get --
-- usr/sbin/update-initramfs --
`
	// tree580 is the same host with 580.95.05.
	tree580 = `
-- proc/driver/nvidia/version --
NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025
-- proc/driver/nvidia/gpus/0000:01:00.0/information --
Model: 		 NVIDIA RTX A6000
GPU UUID: 	 GPU-6a2e5a62-1f1c-5c3e-9f0a-2d7b8e4c1a01
Bus Location: 	 0000:01:00.0
-- proc/driver/nvidia/gpus/0000:c1:00.0/information --
Model: 		 NVIDIA RTX A6000
GPU UUID: 	 GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02
Bus Location: 	 0000:c1:00.0
-- proc/sys/kernel/random/boot_id --
5d1f2a3c-0000-4000-8000-000000000001
-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 --
symlink libnvidia-ml.so.580.95.05
-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05 --
`
	// treeNouveau is a fresh host: nouveau drives the GPUs, no NVIDIA driver.
	treeNouveau = `
-- proc/modules --
nouveau 3096576 1 - Live 0x0000000000000000
drm_ttm_helper 16384 1 nouveau, Live 0x0000000000000000
-- sys/module/nouveau/initstate --
live
-- proc/sys/kernel/random/boot_id --
5d1f2a3c-0000-4000-8000-000000000001
-- etc/modprobe.d/alsa-base.conf --
options snd-usb-audio index=-2
-- usr/sbin/update-initramfs --
`
	// treeBare has no driver and no nouveau (a server GPU with nothing bound).
	treeBare = `
-- proc/modules --
-- proc/sys/kernel/random/boot_id --
5d1f2a3c-0000-4000-8000-000000000001
`
)

const v580 = "580.95.05"

func writeTree(t *testing.T, dir, tree string) {
	t.Helper()
	for _, f := range txtar.Parse([]byte(tree)).Files {
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		os.Remove(p)
		if target, ok := strings.CutPrefix(string(f.Data), "symlink "); ok {
			if err := os.Symlink(strings.TrimSpace(target), p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func fakeRoot(t *testing.T, tree string) string {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, tree)
	return root
}

// fakeRunner records every command. /bin/sh runs for real: it is the fake installer,
// a script the test wrote. Everything else goes to handle (nil: success, no output).
type fakeRunner struct {
	mu     sync.Mutex
	cmds   []resources.Command
	handle func(c resources.Command) ([]byte, error)
}

func (r *fakeRunner) Run(ctx context.Context, c resources.Command) ([]byte, error) {
	r.mu.Lock()
	r.cmds = append(r.cmds, c)
	handle := r.handle
	r.mu.Unlock()
	if c.Name == "/bin/sh" {
		return resources.ExecRunner{}.Run(ctx, c)
	}
	if handle != nil {
		return handle(c)
	}
	return nil, nil
}

// ran returns the commands run so far, as strings, leaving out the installer's path.
func (r *fakeRunner) ran() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, c := range r.cmds {
		if c.Name == "/bin/sh" {
			out = append(out, "installer")
			continue
		}
		out = append(out, c.String())
	}
	return out
}

// fakeInstaller is a .run "installer": a shell script that records its arguments in
// record, writes its log where --log-file-name says, installs libnvidia-ml.so.1 →
// libnvidia-ml.so.VERSION under root, and, with load, loads the module (writes
// proc/driver/nvidia/version). exit is its exit code.
func fakeInstaller(root, record, version string, load bool, exit int) []byte {
	loadCmd := ""
	if load {
		loadCmd = fmt.Sprintf(`mkdir -p "$root/proc/driver/nvidia"
echo "NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  Tue Sep 23 09:55:41 UTC 2025" > "$root/proc/driver/nvidia/version"
`, version)
	}
	fail := ""
	if exit != 0 {
		fail = fmt.Sprintf(`echo "ERROR: Unable to build the NVIDIA kernel module." >> "$log"
exit %d
`, exit)
	}
	return fmt.Appendf(nil, `#!/bin/sh
# A fake NVIDIA-Linux-x86_64-%[1]s.run.
root=%[2]q
printf '%%s\n' "$*" >> %[3]q
log=/dev/null
for a in "$@"; do
	case "$a" in --log-file-name=*) log="${a#--log-file-name=}" ;; esac
done
echo "Verifying archive integrity... OK" > "$log"
%[5]s
lib="$root/usr/lib/x86_64-linux-gnu"
mkdir -p "$lib"
: > "$lib/libnvidia-ml.so.%[1]s"
ln -sfn "libnvidia-ml.so.%[1]s" "$lib/libnvidia-ml.so.1"
%[4]s
echo "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: %[1]s) is now complete." >> "$log"
`, version, root, record, loadCmd, fail)
}

// driverHost is a fake host for the driver tests: tree unpacked under a fresh root, the
// GPUs observed through procfs there, run as the command runner, and a state directory
// of its own.
func driverHost(t *testing.T, tree string, run *fakeRunner) resources.Machine {
	t.Helper()
	root := fakeRoot(t, tree)
	return resources.Machine{Root: root, GPU: gpu.ProcFS{Root: root}, Run: run, StateDir: t.TempDir()}
}

// installer is a fake v580 installer served on loopback for one test.
type installer struct {
	url, sum string
	record   string // where the installer writes its arguments; absent until it runs
}

// serveInstaller serves fakeInstaller(root, …, load, exit) at
// /NVIDIA-Linux-x86_64-580.95.05.run on a loopback server.
func serveInstaller(t *testing.T, root string, load bool, exit int) installer {
	t.Helper()
	in := installer{record: filepath.Join(t.TempDir(), "args")}
	script := fakeInstaller(root, in.record, v580, load, exit)
	srv := fetchtest.NewServer()
	t.Cleanup(srv.Close)
	srv.Set("/NVIDIA-Linux-x86_64-"+v580+".run", script)
	h := sha256.Sum256(script)
	in.url, in.sum = srv.URL("/NVIDIA-Linux-x86_64-"+v580+".run"), hex.EncodeToString(h[:])
	return in
}

// plan is the nvidia_driver "host" block that installs v580 with this installer, with
// extra (attributes of the driver block) after it.
func (in installer) plan(extra string) string {
	return fmt.Sprintf(`
nvidia_driver "host" {
  version = %q
  installer {
    url    = %q
    sha256 = %q
  }
%s}
`, v580, in.url, in.sum, extra)
}

// driverEngine is an engine for src on h, with the engine's state under h.StateDir.
func driverEngine(t *testing.T, h resources.Machine, src string) *agent.Engine {
	t.Helper()
	return restest.Engine(t, t.TempDir(), src, []agent.Kind{DriverKind(h)}, restest.OpenStore(t, filepath.Join(h.StateDir, "state")), agent.Options{})
}

// bindForTest binds src on h and returns its one driver, to be driven directly.
func bindForTest(t *testing.T, h resources.Machine, src string) *Driver {
	t.Helper()
	res, diags := restest.BindPlan(src, []agent.Kind{DriverKind(h)})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	for _, r := range res {
		return r.(*Driver)
	}
	t.Fatal("no resource")
	return nil
}

func oneStep(t *testing.T, rep *agent.Report) *agent.Step {
	t.Helper()
	if len(rep.Steps) != 1 {
		t.Fatalf("%d steps, want 1", len(rep.Steps))
	}
	return rep.Steps[0]
}

func hasString(ss []string, sub string) bool {
	return slices.ContainsFunc(ss, func(s string) bool { return strings.Contains(s, sub) })
}

func fieldValue(st *agent.Status, name string) string {
	for _, f := range st.Fields {
		if f.Name == name {
			return f.Text
		}
	}
	return ""
}

// Issue 6 point 2 ("done means"): a driver change is planned as a replacement, applied
// through the (fake) installer, downloaded and verified through internal/fetch, and,
// with the old module still loaded, reported as reboot required: the check after the
// apply is a no-op, a second apply runs nothing, and status is degraded.
func TestDriverInstallerRebootRequired(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, tree570, run)
	in := serveInstaller(t, h.Root, false, 0)
	e := driverEngine(t, h, fmt.Sprintf(`
nvidia_driver "host" {
  version = %q
  installer {
    url    = %q
    sha256 = %q
    args   = ["--dkms"]
  }
}
`, v580, in.url, in.sum))
	ctx := context.Background()

	st := oneStep(t, e.Plan(ctx))
	if st.Err != nil || st.Diff.Action != agent.Replace || !st.Diff.Action.Destructive() {
		t.Fatalf("plan: %v %+v, want a destructive replace", st.Err, st.Diff)
	}
	if c := st.Diff.Changes[0]; c.Attr != "version" || c.Old != "570.172.08" || c.New != "580.95.05" || c.EffectOf() != agent.Replaces {
		t.Errorf("change %+v", c)
	}

	st = oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v (applied %v)", st.Err, st.Applied)
	}
	args, _ := os.ReadFile(in.record)
	lines := strings.Split(strings.TrimSpace(string(args)), "\n")
	wantLog := filepath.Join(h.StateDir, "nvidia_driver", "host", "nvidia-installer-"+v580+".log")
	if want := "--silent --no-questions --ui=none --disable-nouveau --log-file-name=" + wantLog + " --dkms"; len(lines) != 1 || lines[0] != want {
		t.Errorf("installer arguments:\n%q\nwant one run with\n%q", lines, want)
	}
	if _, err := os.Stat(filepath.Join(h.StateDir, "nvidia_driver", "host", "cache", "NVIDIA-Linux-x86_64-"+v580+".run")); err != nil {
		t.Errorf("installer not kept in the cache: %v", err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"installer"}) {
		t.Errorf("commands %q: want the installer only (no modprobe over a loaded module, no reboot)", got)
	}

	// Installed but not loaded: a no-op with the warning, reported, not retried.
	st = oneStep(t, e.Plan(ctx))
	const warn = "reboot required: installed 580.95.05, loaded 570.172.08"
	if st.Err != nil || st.Diff.Action != agent.NoOp || !hasString(st.Diff.Warnings, warn) {
		t.Fatalf("plan after apply: %v %+v, want a no-op warning %q", st.Err, st.Diff, warn)
	}
	st = oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || st.Applied {
		t.Fatalf("second apply: %v (applied %v), want nothing done", st.Err, st.Applied)
	}
	if args2, _ := os.ReadFile(in.record); string(args2) != string(args) {
		t.Errorf("the installer ran again")
	}
	if got := run.ran(); len(got) != 1 {
		t.Errorf("commands %q after the second apply", got)
	}

	st = oneStep(t, e.Status(ctx))
	if st.Err != nil || st.Status.Healthy || !strings.Contains(st.Status.Summary, warn) {
		t.Fatalf("status: %v %+v, want degraded with %q", st.Err, st.Status, warn)
	}
	if fieldValue(st.Status, "reboot required since") == "" || !strings.Contains(fieldValue(st.Status, "last install"), "installer http://") {
		t.Errorf("status fields %+v", st.Status.Fields)
	}
}

// reboot = "allowed": the reboot is the last step of the apply, asked for once per boot
// and once per cause; a reboot that did not load the module is reported, not repeated.
func TestDriverRebootAllowed(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, tree570, run)
	e := driverEngine(t, h, serveInstaller(t, h.Root, false, 0).plan(`  reboot = "allowed"
`))
	ctx := context.Background()

	st := oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v", st.Err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"installer", "systemctl reboot"}) {
		t.Fatalf("commands %q, want the installer then the reboot, last", got)
	}
	st = oneStep(t, e.Plan(ctx))
	if st.Diff.Action != agent.NoOp || !hasString(st.Diff.Warnings, "has not gone down yet") {
		t.Fatalf("plan while the reboot is pending: %+v", st.Diff)
	}
	oneStep(t, e.Apply(ctx, nil))
	if got := run.ran(); len(got) != 2 {
		t.Fatalf("commands %q: a second reboot was asked for in the same boot", got)
	}

	// The host came back (new boot id) with the old module still loaded: say so, and do
	// not reboot again for the same cause.
	writeTree(t, h.Root, "-- proc/sys/kernel/random/boot_id --\n5d1f2a3c-0000-4000-8000-000000000002\n")
	st = oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || st.Diff.Action != agent.NoOp || !hasString(st.Diff.Warnings, "the reboot did not help") {
		t.Fatalf("after a useless reboot: %v %+v", st.Err, st.Diff)
	}
	if got := run.ran(); len(got) != 2 {
		t.Fatalf("commands %q: rebooted again for the same cause", got)
	}

	// The module loads after the reboot: converged and healthy.
	writeTree(t, h.Root, tree580)
	st = oneStep(t, e.Status(ctx))
	if st.Err != nil || !st.Status.Healthy || st.Status.Summary != "driver 580.95.05 loaded, 2× NVIDIA RTX A6000" {
		t.Fatalf("status after the reboot: %v %+v", st.Err, st.Status)
	}
}

// A fresh host without nouveau: Create; the installer does not load the module, the
// agent tries modprobe once and the host converges without a reboot.
func TestDriverFreshInstallModprobe(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, treeBare, run)
	run.handle = func(c resources.Command) ([]byte, error) {
		if c.String() == "modprobe nvidia" {
			writeTree(t, h.Root, tree580)
		}
		return nil, nil
	}
	e := driverEngine(t, h, serveInstaller(t, h.Root, false, 0).plan(""))
	ctx := context.Background()
	st := oneStep(t, e.Plan(ctx))
	if st.Diff.Action != agent.Create {
		t.Fatalf("plan %+v, want create", st.Diff)
	}
	st = oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v", st.Err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"installer", "modprobe nvidia"}) {
		t.Errorf("commands %q", got)
	}
	if st := oneStep(t, e.Status(ctx)); !st.Status.Healthy {
		t.Errorf("status %+v", st.Status)
	}
}

// A failing installer: the error quotes the tail of its own log. A wrong sha256: the
// download is refused and nothing runs.
func TestDriverInstallerFailures(t *testing.T) {
	t.Parallel()
	t.Run("installer fails", func(t *testing.T) {
		t.Parallel()
		h := driverHost(t, treeBare, &fakeRunner{})
		in := serveInstaller(t, h.Root, false, 1)
		e := driverEngine(t, h, in.plan(""))
		st := oneStep(t, e.Apply(context.Background(), nil))
		for _, want := range []string{"nvidia_driver.host: create: installer " + in.url + " failed: exit status 1",
			"last lines of " + filepath.Join(h.StateDir, "nvidia_driver", "host", "nvidia-installer-580.95.05.log"),
			"ERROR: Unable to build the NVIDIA kernel module."} {
			if st.Err == nil || !strings.Contains(st.Err.Error(), want) {
				t.Errorf("error %v\nlacks %q", st.Err, want)
			}
		}
	})
	t.Run("checksum", func(t *testing.T) {
		t.Parallel()
		run := &fakeRunner{}
		h := driverHost(t, treeBare, run)
		in := serveInstaller(t, h.Root, true, 0)
		in.sum = strings.Repeat("ab", 32)
		d := bindForTest(t, h, in.plan(""))
		d.fetchOpts.RetryBackoff = time.Millisecond
		env := &agent.Env{Addr: "nvidia_driver.host", Log: discardLog()}
		diff, err := d.Check(context.Background(), env)
		if err != nil {
			t.Fatal(err)
		}
		err = d.Apply(context.Background(), env, diff)
		if err == nil || !strings.Contains(err.Error(), "download the installer") || !errors.Is(err, fetch.ErrChecksum) {
			t.Errorf("error %v, want a checksum failure of the download", err)
		}
		if got := run.ran(); len(got) != 0 {
			t.Errorf("commands %q ran after a failed verification", got)
		}
	})
}

// The package path: apt-get install -y PKG, non-interactive, through the runner; the
// old module stays loaded, so reboot required. A package that installs another version
// is an error that says how to pin it.
func TestDriverPackage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		installs string
		wantErr  string
	}{
		{"right version", v580, ""},
		{"other version", "580.105.08", `package nvidia-driver-580 finished, but libnvidia-ml.so.1 is 580.105.08, not 580.95.05: pin the version in package (e.g. "nvidia-driver-580=580.95.05-…")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := &fakeRunner{}
			h := driverHost(t, tree570, run)
			var env []string
			run.handle = func(c resources.Command) ([]byte, error) {
				if c.Name == "apt-get" {
					env = c.Env
					fmt.Fprintf(c.Log, "Setting up nvidia-driver-580 (%s-0ubuntu1) ...\n", tc.installs)
					writeTree(t, h.Root, fmt.Sprintf("-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 --\nsymlink libnvidia-ml.so.%[1]s\n-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.%[1]s --\n", tc.installs))
				}
				return nil, nil
			}
			e := driverEngine(t, h, `
nvidia_driver "host" {
  version = "580.95.05"
  package = "nvidia-driver-580"
}
`)
			st := oneStep(t, e.Apply(context.Background(), nil))
			if got := run.ran(); !slices.Equal(got, []string{"apt-get install -y nvidia-driver-580"}) {
				t.Errorf("commands %q", got)
			}
			if !slices.Equal(env, []string{"DEBIAN_FRONTEND=noninteractive"}) {
				t.Errorf("apt-get environment %q", env)
			}
			if tc.wantErr != "" {
				if st.Err == nil || !strings.Contains(st.Err.Error(), tc.wantErr) {
					t.Fatalf("error %v\nwant %q", st.Err, tc.wantErr)
				}
				return
			}
			if st.Err != nil || !st.Applied {
				t.Fatalf("apply: %v", st.Err)
			}
			if st := oneStep(t, e.Plan(context.Background())); !hasString(st.Diff.Warnings, "reboot required: installed 580.95.05, loaded 570.172.08") {
				t.Errorf("plan after apply %+v", st.Diff)
			}
			log, _ := os.ReadFile(filepath.Join(h.StateDir, "nvidia_driver", "host", "install-580.95.05.log"))
			if !strings.Contains(string(log), "Setting up nvidia-driver-580") {
				t.Errorf("install log %q", log)
			}
		})
	}
}

// Nouveau in the way: the blacklist is written with the file resource's machinery, the
// initramfs rebuilt, the installer held back (it refuses to run over nouveau), and the
// host reported as needing a reboot, once.
func TestDriverNouveau(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, treeNouveau, run)
	e := driverEngine(t, h, serveInstaller(t, h.Root, true, 0).plan(""))
	ctx := context.Background()
	st := oneStep(t, e.Plan(ctx))
	if st.Diff.Action != agent.Update || st.Diff.Changes[0].Attr != "nouveau" ||
		!strings.Contains(st.Diff.Changes[0].Text, "+blacklist nouveau") || !hasString(st.Diff.Warnings, "installs after the reboot") {
		t.Fatalf("plan %+v", st.Diff)
	}
	st = oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v", st.Err)
	}
	p := filepath.Join(h.Root, "etc/modprobe.d/blacklist-nouveau.conf")
	data, err := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if err != nil || string(data) != "blacklist nouveau\noptions nouveau modeset=0\n" || fi.Mode().Perm() != 0o644 {
		t.Errorf("blacklist %q %v", data, err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"update-initramfs -u"}) {
		t.Errorf("commands %q, want the initramfs rebuilt and no installer", got)
	}
	st = oneStep(t, e.Plan(ctx))
	const warn = "reboot required: nouveau is loaded and blacklisted (/etc/modprobe.d/blacklist-nouveau.conf); driver 580.95.05 installs after the reboot"
	if st.Diff.Action != agent.NoOp || !hasString(st.Diff.Warnings, warn) {
		t.Fatalf("plan after apply %+v", st.Diff)
	}

	// After the reboot nouveau is gone: the driver installs.
	os.Remove(filepath.Join(h.Root, "sys/module/nouveau/initstate"))
	writeTree(t, h.Root, "-- proc/modules --\n-- proc/sys/kernel/random/boot_id --\n5d1f2a3c-0000-4000-8000-000000000002\n")
	st = oneStep(t, e.Apply(ctx, nil))
	if st.Err != nil || st.Diff.Action != agent.Create || !st.Applied {
		t.Fatalf("apply after the reboot: %v %+v", st.Err, st.Diff)
	}
}

// fixedGPU is an Observer whose answer the test changes.
type fixedGPU struct {
	mu   sync.Mutex
	info gpu.Info
}

func (f *fixedGPU) Observe(ctx context.Context) (gpu.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.info, ctx.Err()
}

func (f *fixedGPU) set(fn func(*gpu.Info)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(&f.info)
}

func ptrTo[T any](v T) *T { return &v }

func nvmlInfo(version string, pm ...bool) gpu.Info {
	info := gpu.Info{State: gpu.StateOK, Source: gpu.SourceNVML, DriverVersion: version, CUDADriverVersion: "13.0"}
	for i, on := range pm {
		info.GPUs = append(info.GPUs, gpu.Device{Index: i, Name: "NVIDIA RTX A6000", PCIBusID: fmt.Sprintf("0000:%02x:00.0", i+1),
			MemoryTotal: 48 << 30, MemoryFree: 48 << 30, PersistenceMode: ptrTo(on)})
	}
	return info
}

// Persistence mode off on one GPU: an update, applied with nvidia-smi -pm 1.
func TestDriverPersistenceMode(t *testing.T) {
	t.Parallel()
	root := fakeRoot(t, tree580)
	obs := &fixedGPU{info: nvmlInfo(v580, true, false)}
	run := &fakeRunner{handle: func(c resources.Command) ([]byte, error) {
		if c.String() == "nvidia-smi -pm 1" {
			obs.set(func(i *gpu.Info) { i.GPUs[1].PersistenceMode = ptrTo(true) })
		}
		return nil, nil
	}}
	e := driverEngine(t, resources.Machine{Root: root, GPU: obs, Run: run, StateDir: t.TempDir()}, `
nvidia_driver "host" {
  version          = "580.95.05"
  persistence_mode = true
}
`)
	st := oneStep(t, e.Plan(context.Background()))
	if c := st.Diff.Changes; st.Diff.Action != agent.Update || len(c) != 1 || c[0].Attr != "persistence_mode" || c[0].Old != false || c[0].New != true || c[0].EffectOf() != agent.InPlace || c[0].Note != "GPU 1 (nvidia-smi -pm)" {
		t.Fatalf("plan %+v", st.Diff)
	}
	st = oneStep(t, e.Apply(context.Background(), nil))
	if st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v", st.Err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"nvidia-smi -pm 1"}) {
		t.Errorf("commands %q", got)
	}
}

// stopper is a GPUServerStopper that "stops" the servers by taking the PIDs it owns off
// the GPUs.
type stopper struct {
	obs    *fixedGPU
	owns   []int
	called [][]int
	reason string
}

func (s *stopper) StopGPUServers(ctx context.Context, records *state.View, pids []int, reason string) error {
	s.called = append(s.called, pids)
	s.reason = reason
	s.obs.set(func(i *gpu.Info) {
		for g := range i.GPUs {
			i.GPUs[g].Processes = slices.DeleteFunc(i.GPUs[g].Processes, func(p gpu.Process) bool { return slices.Contains(s.owns, p.PID) })
		}
	})
	return nil
}

// A driver change with processes on the GPUs: refused and named when no hook is wired;
// with the hook the servers are stopped first and the release verified through NVML; a
// process the hook does not own is named and the change refused.
func TestDriverStopsGPUServersFirst(t *testing.T) {
	t.Parallel()
	procRoot := t.TempDir()
	for pid, argv := range map[string]string{"4242": "python3\x00-m\x00sglang.launch_server\x00--tp-size\x002\x00", "999": "/usr/bin/foreign-miner\x00"} {
		os.MkdirAll(filepath.Join(procRoot, pid), 0o755)
		if err := os.WriteFile(filepath.Join(procRoot, pid, "cmdline"), []byte(argv), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		hook    bool
		owns    []int
		wantErr string
	}{
		{"no hook", false, nil, "refusing to change the driver: the GPUs are in use by 2 processes: pid 999 (/usr/bin/foreign-miner) 1.0 GiB, pid 4242 (python3 -m sglang.launch_server --tp-size 2) 40.0 GiB"},
		{"hook stops them", true, []int{999, 4242}, ""},
		{"foreign process left", true, []int{4242}, "after the agent's servers stopped, by 1 processes it does not manage: pid 999 (/usr/bin/foreign-miner) 1.0 GiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := &fakeRunner{}
			h := driverHost(t, tree570, run)
			gate := &gateRecorder{run: run} // the host permit: a failed stop is recorded in it
			h.HostDisruption = gate
			in := serveInstaller(t, h.Root, true, 0)
			obs := &fixedGPU{info: nvmlInfo("570.172.08", true, true)}
			obs.info.GPUs[0].Processes = []gpu.Process{{PID: 4242, UsedMemory: 20 << 30}, {PID: 999, UsedMemory: 1 << 30}}
			obs.info.GPUs[1].Processes = []gpu.Process{{PID: 4242, UsedMemory: 20 << 30}}
			h.GPU, h.Proc = obs, proc.FS{Root: procRoot}
			s := &stopper{obs: obs, owns: tc.owns}
			if tc.hook {
				h.StopGPUServers = s
			}
			src := in.plan("")
			e := driverEngine(t, h, src)
			plan := oneStep(t, e.Plan(context.Background()))
			if !hasString(plan.Diff.Warnings, "2 processes use the GPUs: pid 999") {
				t.Errorf("plan warnings %q", plan.Diff.Warnings)
			}
			// Bound directly, to shorten the wait for the foreign process.
			d := bindForTest(t, h, src)
			d.release = 200 * time.Millisecond
			env := &agent.Env{Addr: "nvidia_driver.host", Log: discardLog()}
			diff, err := d.Check(context.Background(), env)
			if err != nil {
				t.Fatal(err)
			}
			err = d.Apply(context.Background(), env, diff)
			_, ranInstaller := os.Stat(in.record)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrGPUInUse) {
					t.Fatalf("apply error %v\nwant %q", err, tc.wantErr)
				}
				if ranInstaller == nil {
					t.Error("the installer ran over GPUs in use")
				}
				if len(gate.failures) != 1 || !strings.HasPrefix(gate.failures[0], "stop: ") || !strings.Contains(gate.failures[0], tc.wantErr) {
					t.Errorf("failures recorded in the host permit %q, want the stop step quoting %q", gate.failures, tc.wantErr)
				}
			} else if err != nil || ranInstaller != nil || len(gate.failures) != 0 {
				t.Fatalf("apply: %v (installer ran: %v, failures recorded %q)", err, ranInstaller == nil, gate.failures)
			}
			if tc.hook && (len(s.called) != 1 || !slices.Equal(s.called[0], []int{999, 4242}) || s.reason != "nvidia_driver.host: driver 570.172.08 → 580.95.05") {
				t.Errorf("hook calls %v, reason %q", s.called, s.reason)
			}
		})
	}
}

// Issue 6 "done means": every GPU state renders as a clear status line, with the fix.
func TestDriverStatusEveryGPUState(t *testing.T) {
	t.Parallel()
	root := fakeRoot(t, tree580)
	for _, s := range []gpu.State{gpu.StateOK, gpu.StateNoLibrary, gpu.StateNoDriver, gpu.StateNoGPU,
		gpu.StateNoPermission, gpu.StateVersionMismatch, gpu.StateError} {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			info := nvmlInfo(v580, true, true)
			if s != gpu.StateOK {
				info = gpu.Info{State: s, Source: gpu.SourceNVML, StateDetail: "nvml init: detail of " + s.String()}
			}
			d := bindForTest(t, resources.Machine{Root: root, GPU: &fixedGPU{info: info}, Run: &fakeRunner{}}, `nvidia_driver "host" { version = "580.95.05" }`)
			st, err := d.Status(context.Background(), &agent.Env{Addr: "nvidia_driver.host", Log: discardLog()})
			if err != nil {
				t.Fatal(err)
			}
			if s == gpu.StateOK {
				if !st.Healthy || st.Summary != "driver 580.95.05 loaded, 2× NVIDIA RTX A6000" || !strings.Contains(fieldValue(st, "gpu 0"), "memory 0 B used of 48.0 GiB, 48.0 GiB free, persistence mode on") {
					t.Errorf("status %+v", st)
				}
				return
			}
			want := "GPUs: " + s.String() + ": " + s.Message() + " (nvml init: detail of " + s.String() + ")"
			if st.Healthy || st.Summary != want {
				t.Errorf("summary %q\nwant      %q", st.Summary, want)
			}
		})
	}
}

// The userspace version through the links distributions use, under the root.
func TestDriverObserveUserspace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, tree, want, note string
	}{
		{"debian alternatives", `
-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 --
symlink /etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu
-- etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu --
symlink /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1
-- usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1 --
symlink libnvidia-ml.so.535.247.01
-- usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.247.01 --
`, "535.247.01", ""},
		{"lib64", "-- usr/lib64/libnvidia-ml.so.1 --\nsymlink libnvidia-ml.so.570.172.08\n-- usr/lib64/libnvidia-ml.so.570.172.08 --\n", "570.172.08", ""},
		{"broken link", "-- usr/lib/libnvidia-ml.so.1 --\nsymlink libnvidia-ml.so.550.54.15\n", "", "/usr/lib/libnvidia-ml.so.1 is a broken link"},
		{"none", "-- etc/hostname --\nkpro5\n", "", "no libnvidia-ml.so.1 in /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := &driverObs{}
			observeUserspace(resources.Machine{Root: fakeRoot(t, tc.tree)}, o)
			if o.Installed != tc.want || !strings.Contains(o.InstalledNote, tc.note) {
				t.Errorf("installed %q note %q, want %q / %q", o.Installed, o.InstalledNote, tc.want, tc.note)
			}
		})
	}
}

// Without an installer or a package, a different driver is an observation error that
// says what is missing; the same driver is merely observed (examples/gpu-check).
func TestDriverObserveOnly(t *testing.T) {
	t.Parallel()
	root := fakeRoot(t, tree570)
	h := resources.Machine{Root: root, GPU: gpu.ProcFS{Root: root}, Run: &fakeRunner{}}
	d := bindForTest(t, h, `nvidia_driver "host" { version = "580.95.05" }`)
	_, err := d.Check(context.Background(), &agent.Env{Log: discardLog()})
	if err == nil || !strings.Contains(err.Error(), "the plan wants driver 580.95.05 and the host has 570.172.08 loaded, and neither installer { url, sha256 } nor package says how to install it") {
		t.Errorf("check: %v", err)
	}
	st, err := d.Status(context.Background(), &agent.Env{Log: discardLog()})
	if err != nil || st.Healthy || !strings.Contains(st.Summary, "neither installer") {
		t.Errorf("status %v %+v", err, st)
	}
	d = bindForTest(t, h, `nvidia_driver "host" { version = "570.172.08" }`)
	diff, err := d.Check(context.Background(), &agent.Env{Log: discardLog()})
	if err != nil || diff.Action != agent.NoOp || len(diff.Warnings) != 0 {
		t.Errorf("check of the loaded version: %v %+v", err, diff)
	}
}

func TestDriverBindErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ src, want string }{
		{`nvidia_driver "h" { version = "latest" }`, "Invalid driver version"},
		{`nvidia_driver "h" { 
  version = "580.95.05"
  reboot = "sometimes"
}`, "Invalid reboot"},
		{`nvidia_driver "h" {
  version = "580.95.05"
  package = "nvidia-driver-580"
  installer {
    url = "https://example.invalid/x.run"
    sha256 = "` + strings.Repeat("0", 64) + `"
  }
}`, "Both installer and package"},
		{`nvidia_driver "h" {
  version = "580.95.05"
  installer {
    url = "ftp://x/y.run"
    sha256 = "ABC"
  }
}`, "Invalid installer URL"},
		{`nvidia_driver "h" {
  version = "580.95.05"
  installer {
    url = "https://x/y.run"
    sha256 = "ABC"
  }
}`, "Invalid installer sha256"},
		{`nvidia_driver "h" {
  version = "580.95.05"
  package = " "
}`, "Empty package"},
	} {
		_, diags := restest.BindPlan(tc.src, []agent.Kind{DriverKind(resources.Machine{GPU: &fixedGPU{}, Run: &fakeRunner{}})})
		if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.want) {
			t.Errorf("%s:\ndiagnostics %v, want %q", tc.src, diags, tc.want)
		}
	}
	d := bindForTest(t, resources.Machine{GPU: &fixedGPU{}, Run: &fakeRunner{}}, `nvidia_driver "h" { version = "580.95.05" }`)
	if !d.blacklist || d.rebootAllowed {
		t.Errorf("defaults: blacklist %v, reboot allowed %v", d.blacklist, d.rebootAllowed)
	}
}

// AGENT_HOST_ROOT moves observation to a fake root, observes GPUs through procfs only,
// and disables host commands.
func TestDriverHostFromEnv(t *testing.T) {
	t.Parallel()
	if h := resources.HostFromEnv(func(string) string { return "" }); h.Root != "" || h.GPU != nil || h.Run != nil {
		t.Errorf("no env: %+v", h)
	}
	h := resources.HostFromEnv(func(k string) string { return map[string]string{resources.HostRootEnv: "/tmp/fake"}[k] })
	if h.Root != "/tmp/fake" || h.GPU != (gpu.ProcFS{Root: "/tmp/fake"}) {
		t.Errorf("with env: %+v", h)
	}
	if _, err := h.Run.Run(context.Background(), resources.Command{Name: "apt-get"}); !errors.Is(err, resources.ErrCommandsDisabled) {
		t.Errorf("runner: %v", err)
	}
}

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// Two causes at once (the new module not loaded, nouveau still loaded): one reboot for
// both, never a second one in the same boot.
func TestDriverOneRebootPerBoot(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, tree570+`-- sys/module/nouveau/initstate --
live
-- etc/modprobe.d/blacklist-nouveau.conf --
blacklist nouveau
`, run)
	run.handle = func(c resources.Command) ([]byte, error) {
		if c.Name == "apt-get" {
			writeTree(t, h.Root, "-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 --\nsymlink libnvidia-ml.so.580.95.05\n-- usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05 --\n")
		}
		return nil, nil
	}
	e := driverEngine(t, h, `
nvidia_driver "host" {
  version = "580.95.05"
  package = "nvidia-driver-580"
  reboot  = "allowed"
}
`)
	for range 2 {
		if st := oneStep(t, e.Apply(context.Background(), nil)); st.Err != nil {
			t.Fatal(st.Err)
		}
	}
	if got := run.ran(); !slices.Equal(got, []string{"apt-get install -y nvidia-driver-580", "systemctl reboot"}) {
		t.Errorf("commands %q", got)
	}
	st := oneStep(t, e.Plan(context.Background()))
	if st.Diff.Action != agent.NoOp || len(st.Diff.Warnings) != 2 {
		t.Errorf("plan %+v", st.Diff)
	}
}

// TestDriverCheckWritesNothing: the driver's Check writes nothing (issue 24; see
// restest.CheckWritesNothing).
func TestDriverCheckWritesNothing(t *testing.T) {
	t.Parallel()
	root := fakeRoot(t, tree570)
	h := resources.Machine{Root: root, GPU: gpu.ProcFS{Root: root}, Run: &fakeRunner{}}
	dir := t.TempDir()
	store := restest.OpenStore(t, filepath.Join(dir, ".state"))
	if d := restest.CheckWritesNothing(t, dir, `nvidia_driver "host" { version = "570.172.08" }`, []agent.Kind{DriverKind(h)}, store, "nvidia_driver.host"); d.Action != agent.NoOp {
		t.Errorf("diff %+v, want a no-op", d)
	}
}
