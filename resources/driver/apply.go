package driver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
)

// ErrGPUInUse is wrapped by the error of a driver change refused because processes use
// the GPUs.
var ErrGPUInUse = errors.New("the GPUs are in use")

// releaseTimeout bounds the wait for GPU memory after the servers were stopped.
const releaseTimeout = 2 * time.Minute

// installerArgs make NVIDIA's .run installer run unattended.
var installerArgs = []string{"--silent", "--no-questions", "--ui=none", "--disable-nouveau"}

// Apply carries out what Check decided, in this order: blacklist nouveau, stop the GPU
// servers and install the driver, set persistence mode, and, as the very last step and
// only when the host still needs it, reboot (reboot = "allowed") or record that it must.
func (d *Driver) Apply(ctx context.Context, env *agent.Env, diff *agent.Diff) error {
	det := diff.Detail.(*driverPlan)
	loaded := "" // the driver before this apply, for the fleet's host permit
	if det.obs != nil {
		loaded = det.obs.Loaded
	}
	rec, err := d.load(env)
	if err != nil {
		return err
	}
	now := time.Now
	if env.Now != nil {
		now = env.Now
	}

	if det.blacklist != nil {
		if err := d.blacklistFile().Apply(ctx, env, det.blacklist); err != nil {
			return fmt.Errorf("nouveau blacklist: %w", err)
		}
		if err := d.updateInitramfs(ctx, env); err != nil {
			return err
		}
	}

	if det.install {
		if det.replacing {
			if err := d.beginDisruption(ctx, loaded); err != nil {
				return err
			}
			if err := d.stopGPUUsers(ctx, env, det.obs); err != nil {
				return d.disruptionFailed(ctx, env, "stop", err)
			}
		}
		note, err := d.install(ctx, env)
		if note != nil {
			note.At = now()
			rec.LastInstall = note
			if serr := d.save(env, rec); serr != nil && err == nil {
				err = serr
			}
		}
		if err != nil {
			return d.disruptionFailed(ctx, env, "install", err)
		}
		// A fresh host: the installer may not have loaded the module; try once. A failure
		// is not an error: the reboot below (or its warning) covers it.
		if o, err := observeDriver(ctx, d.host); err == nil && o.Loaded == "" && !o.Nouveau {
			if out, err := d.host.Run.Run(ctx, resources.Command{Name: "modprobe", Args: []string{"nvidia"}}); err != nil {
				env.Log.Warn("modprobe nvidia failed; a reboot loads the driver", "err", err, "output", string(bytes.TrimSpace(out)))
			}
		}
	}

	if det.pm != nil {
		v := "0"
		if *det.pm {
			v = "1"
		}
		if out, err := d.host.Run.Run(ctx, resources.Command{Name: "nvidia-smi", Args: []string{"-pm", v}}); err != nil {
			return fmt.Errorf("persistence mode: nvidia-smi -pm %s: %w: %s", v, err, resources.TailLines(out, 5))
		}
	}

	// The last step: does the host need a reboot now?
	o, err := observeDriver(ctx, d.host)
	if err != nil {
		return fmt.Errorf("observe after apply: %w", err)
	}
	o.GPUReboots = gpuRebootCauses(env, d.host)
	causes := d.rebootCauses(o)
	if len(causes) == 0 {
		if rec.RebootRequired != nil {
			rec.RebootRequired = nil
			return d.save(env, rec)
		}
		return nil
	}
	c := causes[0]
	if rec.RebootRequired == nil || rec.RebootRequired.Cause != c.key {
		rec.RebootRequired = &rebootNote{Cause: c.key, Reason: c.reason, BootID: o.BootID, At: now()}
	}
	if err := d.save(env, rec); err != nil {
		return err
	}
	var ask *rebootNote
	for _, c := range causes {
		if _, r := d.rebootVerdict(c, o, rec); r {
			ask = &rebootNote{Cause: c.key, Reason: c.reason, BootID: o.BootID, At: now(), Agent: d.host.AgentStart}
			break
		}
	}
	if ask == nil {
		env.Log.Warn("reboot required", "reason", c.reason, "reboot", map[bool]string{true: "allowed", false: "never"}[d.rebootAllowed])
		return nil
	}
	// The fleet's host permit first: a refusal (or no lease yet) records nothing, so the
	// next pass asks again.
	if hd := d.host.HostDisruption; hd != nil {
		if err := hd.Rebooting(ctx, "reboot", d.disruptionDetail(loaded)+": "+ask.Reason, o.BootID); err != nil {
			return fmt.Errorf("reboot (%s): the fleet's host permit: %w", ask.Reason, err)
		}
	}
	if r := rec.RebootRequested; r != nil && r.BootID == o.BootID {
		env.Log.Warn("the reboot an earlier agent asked for did not happen: asking again", "asked", agent.HumanTime(r.At))
	}
	// Recorded before the command, so that whatever happens next this agent never asks
	// twice in the same boot.
	rec.RebootRequested = ask
	if err := d.save(env, rec); err != nil {
		return err
	}
	env.Log.Warn("rebooting the host", "reason", rec.RebootRequested.Reason)
	if out, err := d.host.Run.Run(ctx, resources.Command{Name: "systemctl", Args: []string{"reboot"}}); err != nil {
		return d.disruptionFailed(ctx, env, "reboot", fmt.Errorf("reboot (%s): systemctl reboot: %w: %s", rec.RebootRequested.Reason, err, resources.TailLines(out, 5)))
	}
	return nil
}

// stopGPUUsers makes sure no process uses the GPUs before the driver under them changes:
// the agent's servers are stopped through the hook, and NVML must then list no process.
func (d *Driver) stopGPUUsers(ctx context.Context, env *agent.Env, before *driverObs) error {
	info := before.Info
	if info.Source != gpu.SourceNVML || info.State != gpu.StateOK {
		env.Log.Warn("GPU processes cannot be listed before the driver change; the installer refuses to unload a module in use",
			"state", info.State.String(), "source", info.Source)
		return nil
	}
	ps := gpuProcesses(info)
	if len(ps) == 0 {
		return nil
	}
	if d.host.StopGPUServers == nil {
		return fmt.Errorf("refusing to change the driver: %w by %d processes: %s; stop them (or let the agent's servers be stopped by wiring the server hook) and apply again",
			ErrGPUInUse, len(ps), describeProcesses(d.host, ps))
	}
	pids := make([]int, len(ps))
	for i, p := range ps {
		pids[i] = p.PID
	}
	reason := fmt.Sprintf("%s: driver %s → %s", d.addr, before.Loaded, d.version)
	var records *state.View
	if env.State != nil {
		records = env.State.Others()
	}
	if err := d.host.StopGPUServers.StopGPUServers(ctx, records, pids, reason); err != nil {
		return fmt.Errorf("stop the servers before the driver change: %w", err)
	}
	wait := d.release
	if wait <= 0 {
		wait = releaseTimeout
	}
	if err := gpu.WaitReleased(ctx, d.host.GPU, pids, time.Now().Add(wait), min(gpu.DefaultPollInterval, wait/10)); err != nil {
		if !errors.Is(err, gpu.ErrNotReleased) {
			return err
		}
		info, oerr := d.host.GPU.Observe(ctx)
		if oerr != nil {
			return err
		}
		left := gpuProcesses(info)
		return fmt.Errorf("refusing to change the driver: %w after the agent's servers stopped, by %d processes it does not manage: %s; stop them and apply again",
			ErrGPUInUse, len(left), describeProcesses(d.host, left))
	}
	return nil
}

// workDir is where the driver keeps its downloads and logs: <state dir>/nvidia_driver/NAME.
func (d *Driver) workDir(env *agent.Env) string {
	return filepath.Join(d.stateDir(env), "nvidia_driver", d.name)
}

// stateDir is the agent's state directory.
func (d *Driver) stateDir(env *agent.Env) string {
	dir := d.host.StateDir
	if dir == "" && env.State != nil {
		dir = env.State.Dir()
	}
	if dir == "" {
		dir = state.DefaultDir
	}
	return dir
}

// install runs the installer or the package manager and verifies that the userspace
// library is the wanted version afterwards. The note says what ran and where its log is,
// also on failure.
func (d *Driver) install(ctx context.Context, env *agent.Env) (*installNote, error) {
	dir := d.workDir(env)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "install-"+d.version+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	note := &installNote{Version: d.version, Log: logPath}

	var cmd resources.Command
	quote := logPath // the log whose tail explains a failure
	if d.installer != nil {
		note.Method = "installer " + d.installer.URL
		name := resources.InstallerName(d.installer.URL, d.version)
		opts := d.fetchOpts
		opts.Dest = filepath.Join(dir, "cache")
		res, err := fetch.Fetch(ctx, []fetch.File{{Name: name, URL: d.installer.URL, Size: -1, SHA256: d.installer.SHA256}}, opts)
		if err != nil {
			return note, fmt.Errorf("download the installer: %w", err)
		}
		runFile := res.Files[0].Path
		nvLog := filepath.Join(dir, "nvidia-installer-"+d.version+".log")
		_ = os.Remove(nvLog) // never quote a previous run's log
		args := append([]string{runFile}, installerArgs...)
		args = append(args, "--log-file-name="+nvLog)
		args = append(args, d.installer.Args...)
		// sh runs the makeself archive even from a noexec state directory.
		cmd = resources.Command{Name: "/bin/sh", Args: args, Log: logf}
		quote = nvLog
	} else {
		note.Method = "package " + d.pkg
		switch {
		case exists(d.host.Path("usr/bin/apt-get")):
			cmd = resources.Command{Name: "apt-get", Args: []string{"install", "-y", d.pkg}, Env: []string{"DEBIAN_FRONTEND=noninteractive"}, Log: logf}
		case exists(d.host.Path("usr/bin/dnf")):
			cmd = resources.Command{Name: "dnf", Args: []string{"install", "-y", d.pkg}, Log: logf}
		default:
			return note, fmt.Errorf("package %q: no package manager found (apt-get or dnf under %s)", d.pkg, d.host.Path("usr/bin"))
		}
	}
	fmt.Fprintf(logf, "# %s: %s\n", time.Now().UTC().Format(time.RFC3339), cmd)
	env.Log.Info("installing the driver", "version", d.version, "command", cmd.String(), "log", logPath)
	if _, err := d.host.Run.Run(ctx, cmd); err != nil {
		if _, serr := os.Stat(quote); serr != nil {
			quote = logPath
		}
		return note, fmt.Errorf("%s failed: %w; last lines of %s:\n%s", note.Method, err, quote, tailFile(quote, 15))
	}

	o := &driverObs{}
	observeUserspace(d.host, o)
	if o.Installed != d.version {
		got := o.Installed
		if got == "" {
			got = "not found (" + o.InstalledNote + ")"
		}
		fix := "check its log " + logPath
		if d.pkg != "" {
			fix = fmt.Sprintf("pin the version in package (e.g. \"%s=%s-…\") or set version to what it installs", d.pkg, d.version)
		}
		return note, fmt.Errorf("%s finished, but libnvidia-ml.so.1 is %s, not %s: %s", note.Method, got, d.version, fix)
	}
	return note, nil
}

// updateInitramfs rebuilds the initramfs after the blacklist, so that nouveau is not
// loaded from it at the next boot.
func (d *Driver) updateInitramfs(ctx context.Context, env *agent.Env) error {
	var cmd resources.Command
	switch {
	case exists(d.host.Path("usr/sbin/update-initramfs")):
		cmd = resources.Command{Name: "update-initramfs", Args: []string{"-u"}}
	case exists(d.host.Path("usr/bin/dracut")):
		cmd = resources.Command{Name: "dracut", Args: []string{"--force"}}
	default:
		env.Log.Info("no update-initramfs or dracut: the initramfs is not rebuilt")
		return nil
	}
	if out, err := d.host.Run.Run(ctx, cmd); err != nil {
		return fmt.Errorf("nouveau blacklist: %s: %w: %s", cmd, err, resources.TailLines(out, 10))
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func tailFile(p string, n int) string {
	data, err := os.ReadFile(p)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return resources.TailLines(data, n)
}

// beginDisruption takes the fleet's host permit (Machine.HostDisruption) before a
// replace stops the servers; without coordination it asks nothing.
func (d *Driver) beginDisruption(ctx context.Context, loaded string) error {
	if d.host.HostDisruption == nil {
		return nil
	}
	if err := d.host.HostDisruption.Begin(ctx, "driver", d.disruptionDetail(loaded)); err != nil {
		return fmt.Errorf("driver %s: the fleet's host permit: %w", d.version, err)
	}
	return nil
}

// disruptionFailed records in the fleet's host permit (if this host holds one) that step
// of the disruption failed with err, which stops the host group fleet-wide until this
// host is verified again, and returns err. A step cut off by the agent's own shutdown
// (the reboot stops it) is no failure.
func (d *Driver) disruptionFailed(ctx context.Context, env *agent.Env, step string, err error) error {
	if d.host.HostDisruption == nil || ctx.Err() != nil {
		return err
	}
	if ferr := d.host.HostDisruption.Failed(ctx, step, err); ferr != nil {
		env.Log.Warn("the host disruption's failure is not recorded in the fleet's host permit", "step", step, "error", ferr)
	}
	return err
}

// disruptionDetail is what a host permit says of this driver change.
func (d *Driver) disruptionDetail(loaded string) string {
	if loaded == "" || loaded == d.version { // a fresh install, or a reboot for a GPU fault
		return "driver " + d.version
	}
	return fmt.Sprintf("driver %s → %s", loaded, d.version)
}
