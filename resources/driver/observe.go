package driver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/resources"
)

// driverVersionRE is an NVIDIA driver version: 580.95.05, 570.172.08, 550.54.
var driverVersionRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,3}$`)

// userspaceLibDirs are where distributions and the .run installer put
// libnvidia-ml.so.1, relative to the host root, in the order they are searched.
var userspaceLibDirs = []string{
	"usr/lib/x86_64-linux-gnu",
	"usr/lib64",
	"usr/lib",
	"usr/lib/aarch64-linux-gnu",
}

// modprobeDirs hold modprobe configuration, relative to the host root.
var modprobeDirs = []string{"etc/modprobe.d", "run/modprobe.d", "usr/lib/modprobe.d", "lib/modprobe.d"}

// driverObs is one observation of the driver on the host.
type driverObs struct {
	// Loaded is the loaded kernel module's version; "" when no nvidia module is loaded.
	Loaded     string
	LoadedOpen bool   // the open GPU kernel module
	LoadedFrom string // the file it was read from

	// Installed is the userspace version, from libnvidia-ml.so.1's link target; "" when
	// the library was not found (InstalledNote says what was seen).
	Installed     string
	InstalledLib  string // "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 → libnvidia-ml.so.580.95.05"
	InstalledNote string

	// Info is NVML's view (or the procfs fallback's) through Machine.GPU.
	Info gpu.Info

	Nouveau            bool   // the nouveau module is loaded
	NouveauBlacklisted string // a modprobe.d file that blacklists nouveau; "" when none

	BootID string // this boot's id; "" when not readable

	// GPUReboots are the GPUs whose faults ask for the machine to be rebooted (the
	// server kind's fault watch under agent run; docs/gpu.md, "When a GPU fails").
	GPUReboots []rebootCause
}

// gpuRebootCauses are the reboots the judgements of m's GPUs ask for: one cause per GPU
// and fault, so a reboot that did not clear it is not asked for again.
func gpuRebootCauses(env *agent.Env, m resources.Machine) []rebootCause {
	h, ok := agent.Recall[*resources.HostFaults](env.Memory, resources.FaultsKey(m))
	if !ok {
		return nil
	}
	var out []rebootCause
	for _, j := range h.Reboots() {
		f := j.Cause
		out = append(out, rebootCause{key: fmt.Sprintf("gpu/%s/%s/%d/%d", j.PCIBusID, f.Kind, f.Xid, f.At.Unix()),
			reason: j.Name() + " " + gpu.Explain(*f), never: "reboot the host to bring the GPU back"})
	}
	return out
}

// userspace is the installed userspace version the driver resource compares: the
// library's link target, or, when the library was not found in the usual places but NVML
// works, the loaded version (NVML's Init fails on a userspace/module mismatch).
func (o *driverObs) userspace() string {
	if o.Installed != "" {
		return o.Installed
	}
	if o.Info.Source == gpu.SourceNVML && (o.Info.State == gpu.StateOK || o.Info.State == gpu.StateNoGPU) {
		return o.Loaded
	}
	return ""
}

// observeDriver reads everything the nvidia_driver resource compares with the plan.
func observeDriver(ctx context.Context, h resources.Machine) (*driverObs, error) {
	o := &driverObs{}
	if err := observeLoaded(h, o); err != nil {
		return nil, err
	}
	observeUserspace(h, o)
	if err := observeNouveau(h, o); err != nil {
		return nil, err
	}
	o.BootID = h.BootID()
	info, err := h.GPU.Observe(ctx)
	if err != nil {
		return nil, fmt.Errorf("observe the GPUs: %w", err)
	}
	o.Info = info
	return o, nil
}

// observeLoaded reads the loaded module's version from /proc/driver/nvidia/version, or
// /sys/module/nvidia/version when /proc/driver/nvidia is hidden (some containers).
func observeLoaded(h resources.Machine, o *driverObs) error {
	p := h.Path("proc/driver/nvidia/version")
	data, err := os.ReadFile(p)
	switch {
	case err == nil:
		m, err := gpu.ParseVersionFile(data)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		o.Loaded, o.LoadedOpen, o.LoadedFrom = m.Version, m.Open, p
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	p = h.Path("sys/module/nvidia/version")
	data, err = os.ReadFile(p)
	switch {
	case err == nil:
		v := strings.TrimSpace(string(data))
		if !driverVersionRE.MatchString(v) {
			return fmt.Errorf("%s: no driver version in %q", p, v)
		}
		o.Loaded, o.LoadedFrom = v, p
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return nil
}

// observeUserspace follows libnvidia-ml.so.1 in the usual library directories to the
// versioned file it names (libnvidia-ml.so.580.95.05), through any chain of links
// (Debian's alternatives), resolving absolute targets under the host root.
func observeUserspace(h resources.Machine, o *driverObs) {
	var notes []string
	for _, dir := range userspaceLibDirs {
		link := "/" + dir + "/libnvidia-ml.so.1"
		cur := h.Path(link)
		var final string
		for range 16 {
			fi, err := os.Lstat(cur)
			if err != nil {
				if cur != h.Path(link) {
					notes = append(notes, fmt.Sprintf("%s is a broken link (%s)", link, err))
				}
				break
			}
			if fi.Mode()&fs.ModeSymlink == 0 {
				final = cur
				break
			}
			t, err := os.Readlink(cur)
			if err != nil {
				notes = append(notes, err.Error())
				break
			}
			if filepath.IsAbs(t) {
				cur = h.Path(t)
			} else {
				cur = filepath.Join(filepath.Dir(cur), t)
			}
		}
		if final == "" {
			continue
		}
		name := filepath.Base(final)
		v := strings.TrimPrefix(name, "libnvidia-ml.so.")
		if !driverVersionRE.MatchString(v) || v == "1" {
			notes = append(notes, fmt.Sprintf("%s is %s, which does not name a driver version", link, name))
			continue
		}
		o.Installed, o.InstalledLib = v, link+" → "+name
		return
	}
	if len(notes) == 0 {
		notes = append(notes, "no libnvidia-ml.so.1 in /"+strings.Join(userspaceLibDirs, ", /"))
	}
	o.InstalledNote = strings.Join(notes, "; ")
}

// observeNouveau finds out whether nouveau is loaded (/proc/modules, or
// /sys/module/nouveau/initstate, which a built-in module lacks) and whether a modprobe.d
// file blacklists it.
func observeNouveau(h resources.Machine, o *driverObs) error {
	if data, err := os.ReadFile(h.Path("proc/modules")); err == nil {
		for line := range strings.Lines(string(data)) {
			if strings.HasPrefix(line, "nouveau ") {
				o.Nouveau = true
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, err := os.Stat(h.Path("sys/module/nouveau/initstate")); err == nil {
		o.Nouveau = true
	}
	for _, dir := range modprobeDirs {
		files, _ := filepath.Glob(h.Path(dir + "/*.conf"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			sc := bufio.NewScanner(bytes.NewReader(data))
			for sc.Scan() {
				if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "blacklist" && fields[1] == "nouveau" {
					o.NouveauBlacklisted = "/" + dir + "/" + filepath.Base(f)
					return nil
				}
			}
		}
	}
	return nil
}

// gpuProcesses lists every compute process on every GPU, one entry per PID with its
// memory summed, sorted by PID.
func gpuProcesses(info gpu.Info) []gpu.Process {
	var pids []int
	for _, d := range info.GPUs {
		for _, p := range d.Processes {
			pids = append(pids, p.PID)
		}
	}
	return gpu.ProcessesUsing(info, pids)
}

// describeProcesses renders processes for an operator: "pid 4242 (python3 -m
// sglang.launch_server …) 70.0 GiB", command lines read through h.Proc.
func describeProcesses(h resources.Machine, ps []gpu.Process) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("pid %d (%s) %s", p.PID, cmdlineOf(h, p.PID), bytesize.Format(p.UsedMemory))
	}
	return strings.Join(parts, ", ")
}

func cmdlineOf(h resources.Machine, pid int) string {
	argv, err := h.Proc.Cmdline(pid)
	switch {
	case err != nil:
		return "command line not readable"
	case len(argv) == 0:
		return "no command line"
	}
	s := strings.Join(argv, " ")
	if len(s) > 120 {
		s = s[:117] + "…"
	}
	return s
}
