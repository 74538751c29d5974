// Package driver is the `nvidia_driver` resource kind: the host's NVIDIA kernel module
// and userspace, installed with NVIDIA's .run installer, nouveau blacklisted, a reboot
// when one is needed.
package driver

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// DriverConfig is the `nvidia_driver` block.
type DriverConfig struct {
	Version          string           `hcl:"version"`
	Installer        *DriverInstaller `hcl:"installer,block"`
	Package          *string          `hcl:"package,optional"`
	PersistenceMode  *bool            `hcl:"persistence_mode,optional"`
	Reboot           *string          `hcl:"reboot,optional"`
	BlacklistNouveau *bool            `hcl:"blacklist_nouveau,optional"`
}

// DriverInstaller is the `installer` block: NVIDIA's .run installer.
type DriverInstaller struct {
	URL    string   `hcl:"url"`
	SHA256 string   `hcl:"sha256"`
	Args   []string `hcl:"args,optional"` // extra installer arguments (--dkms, --no-opengl-files)
}

// nouveauBlacklist is what the nouveau blacklist file holds: the module is never
// auto-loaded, and modeset=0 keeps it off the console should it be loaded by hand.
const (
	nouveauBlacklistPath    = "/etc/modprobe.d/blacklist-nouveau.conf"
	nouveauBlacklistContent = "blacklist nouveau\noptions nouveau modeset=0\n"
)

// Driver is the NVIDIA kernel driver and its userspace libraries on the host.
//
// It compares three facts with the plan's version: the loaded kernel module, the
// installed userspace library (libnvidia-ml.so.1's link target) and NVML's view. A
// missing driver is created, a different one replaced (a destructive change: GPU
// processes are stopped first, through Machine.StopGPUServers), a nouveau module in the way
// blacklisted, and persistence mode set. A driver that is installed but not loaded needs
// a reboot: with reboot = "never" that is a warning and a degraded status, never a change
// retried in a loop; with reboot = "allowed" the agent reboots, at most once per boot and
// once per cause (recorded in its state), as the last step of an apply.
type Driver struct {
	addr          string
	name          string
	version       string
	installer     *DriverInstaller
	pkg           string
	persistence   *bool
	rebootAllowed bool
	blacklist     bool
	host          resources.Machine
	release       time.Duration // how long stopped servers' GPU memory may take to be freed; 0: releaseTimeout
	fetchOpts     fetch.Options // the installer's download options (Dest is set by install)
}

var (
	_ agent.Resource  = (*Driver)(nil)
	_ agent.Statuser  = (*Driver)(nil)
	_ agent.Timeouter = (*Driver)(nil)
)

// DriverKind is the `nvidia_driver` resource kind, acting on h.
func DriverKind(h resources.Machine) agent.Kind {
	if h.Run == nil {
		h.Run = resources.ExecRunner{}
	}
	if h.GPU == nil {
		h.GPU = gpu.Default(h.Root)
	}
	if h.AgentStart == "" {
		h.AgentStart = resources.ProcessStart()
	}
	return agent.NewKind("nvidia_driver", func(r *plans.Resource, c *DriverConfig) (agent.Resource, hcl.Diagnostics) {
		return bindDriver(r, c, h)
	})
}

func bindDriver(r *plans.Resource, c *DriverConfig, h resources.Machine) (agent.Resource, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	bad := func(summary, detail string, path ...string) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: r.Range(path...).Ptr()})
	}
	d := &Driver{addr: r.Addr, name: r.Name, version: c.Version, installer: c.Installer, pkg: resources.Deref(c.Package),
		persistence: c.PersistenceMode, blacklist: c.BlacklistNouveau == nil || *c.BlacklistNouveau, host: h}
	if !driverVersionRE.MatchString(c.Version) {
		bad("Invalid driver version", fmt.Sprintf("version %q is not an NVIDIA driver version such as \"580.95.05\".", c.Version), "version")
	}
	switch rb := resources.Deref(c.Reboot); rb {
	case "", "never":
	case "allowed":
		d.rebootAllowed = true
	default:
		bad("Invalid reboot", fmt.Sprintf("reboot is \"never\" (report that a reboot is required) or \"allowed\" (reboot as the last step of an apply), not %q.", rb), "reboot")
	}
	if c.Package != nil && strings.TrimSpace(*c.Package) == "" {
		bad("Empty package", "package names the host package that installs the driver, such as \"nvidia-driver-580\".", "package")
	}
	if c.Installer != nil {
		if c.Package != nil {
			bad("Both installer and package", "Install the driver with NVIDIA's installer (installer { url, sha256 }) or with the host's package manager (package), not both.", "package")
		}
		u := c.Installer.URL
		if !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "http://") {
			bad("Invalid installer URL", fmt.Sprintf("url %q must be an https URL of NVIDIA's .run installer.", u), "installer", "url")
		}
		if b, err := hex.DecodeString(c.Installer.SHA256); err != nil || len(b) != 32 || strings.ToLower(c.Installer.SHA256) != c.Installer.SHA256 {
			bad("Invalid installer sha256", "sha256 is the installer's SHA-256 digest: 64 lower-case hex digits (sha256sum prints it).", "installer", "sha256")
		}
	}
	if diags.HasErrors() {
		return nil, diags
	}
	return d, nil
}

// Timeout implements agent.Timeouter.
func (d *Driver) Timeout() time.Duration { return resources.DriverTimeout }

// driverRecord is the resource's state: facts the agent proved or did, never the plan.
type driverRecord struct {
	// RebootRequired is the last apply's finding that the host needs a reboot, so status
	// can say since when.
	RebootRequired *rebootNote `json:"reboot_required,omitempty"`
	// RebootRequested is the last reboot the agent asked for: never twice for one cause.
	RebootRequested *rebootNote `json:"reboot_requested,omitempty"`
	// LastInstall is the last install the agent ran.
	LastInstall *installNote `json:"last_install,omitempty"`
}

type rebootNote struct {
	Cause  string    `json:"cause"` // "580.95.05/module" or "580.95.05/nouveau"
	Reason string    `json:"reason"`
	BootID string    `json:"boot_id,omitempty"`
	At     time.Time `json:"at"`
	// Agent is the agent process that asked (resources.ProcessStart), for a reboot request.
	Agent string `json:"agent,omitempty"`
}

type installNote struct {
	Version string    `json:"version"`
	Method  string    `json:"method"` // "installer URL" or "package NAME"
	Log     string    `json:"log"`
	At      time.Time `json:"at"`
}

// driverPlan is what Check decided, for Apply.
type driverPlan struct {
	install   bool        // run the installer or the package manager
	replacing bool        // a loaded driver is replaced: GPU processes must stop first
	blacklist *agent.Diff // the blacklist file's own diff; nil: nothing to write
	pm        *bool       // set persistence mode to this; nil: leave it
	reboot    bool        // reboot (reboot = "allowed", needed, not yet asked for)
	obs       *driverObs
}

// rebootCause is one reason the host needs a reboot.
type rebootCause struct {
	key    string // "580.95.05/module"
	reason string // "installed 580.95.05, loaded 570.172.08"
	never  string // what reboot = "never" tells the operator; "" is "reboot the host to load it"
}

// rebootCauses lists why the host needs a reboot now: the wanted version installed but
// not loaded, or nouveau loaded although blacklisted.
func (d *Driver) rebootCauses(o *driverObs) []rebootCause {
	var cs []rebootCause
	if o.userspace() == d.version && o.Loaded != d.version {
		loaded := o.Loaded
		if loaded == "" {
			loaded = "none"
		}
		cs = append(cs, rebootCause{key: d.version + "/module", reason: fmt.Sprintf("installed %s, loaded %s", d.version, loaded)})
	}
	if o.Nouveau && o.NouveauBlacklisted != "" {
		r := "nouveau is loaded and blacklisted (" + o.NouveauBlacklisted + ")"
		if o.userspace() != d.version {
			r += "; driver " + d.version + " installs after the reboot"
		}
		cs = append(cs, rebootCause{key: d.version + "/nouveau", reason: r})
	}
	return append(cs, o.GPUReboots...)
}

func (d *Driver) blacklistFile() *resources.File {
	mode := resources.OctalMode(0o644)
	return resources.NewFile(resources.FileSpec{Addr: d.addr + ".blacklist_nouveau", Path: d.host.Path(nouveauBlacklistPath),
		Content: []byte(nouveauBlacklistContent), Mode: &mode})
}

func (d *Driver) load(env *agent.Env) (driverRecord, error) {
	var rec driverRecord
	if env.State == nil {
		return rec, nil
	}
	if _, err := env.State.Load(&rec); err != nil {
		return rec, err
	}
	return rec, nil
}

func (d *Driver) save(env *agent.Env, rec driverRecord) error {
	if env.State == nil {
		return nil
	}
	return env.State.Save(rec)
}

// Check observes the driver and compares it with the plan.
func (d *Driver) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	o, err := observeDriver(ctx, d.host)
	if err != nil {
		return nil, err
	}
	o.GPUReboots = gpuRebootCauses(env, d.host)
	rec, err := d.load(env)
	if err != nil {
		return nil, err
	}
	return d.decide(ctx, env, o, rec)
}

// decide turns an observation and the record into a diff. It changes nothing.
func (d *Driver) decide(ctx context.Context, env *agent.Env, o *driverObs, rec driverRecord) (*agent.Diff, error) {
	det := &driverPlan{obs: o}
	diff := &agent.Diff{Detail: det}
	user := o.userspace()
	have := user
	if have == "" {
		have = o.Loaded
	}

	// Nouveau in the way: blacklist it (a reboot then unloads it).
	if o.Nouveau && o.NouveauBlacklisted == "" {
		if d.blacklist {
			fd, err := d.blacklistFile().Check(ctx, env)
			if err != nil {
				return nil, fmt.Errorf("nouveau blacklist: %w", err)
			}
			det.blacklist = fd
			c := agent.Set("nouveau", "loaded", "blacklisted")
			c.Note = "writes " + nouveauBlacklistPath + "; takes effect at the next boot"
			for _, fc := range fd.Changes {
				if fc.Attr == "content" {
					c.Text = fc.Text
				}
			}
			diff.Add(c.Because(agent.InPlace, agent.ReasonDiffers))
		} else {
			diff.Warnings = append(diff.Warnings, "nouveau is loaded and not blacklisted (blacklist_nouveau = false): the nvidia module cannot drive the GPUs while it is")
		}
	}

	// The version.
	switch {
	case user == d.version:
		// Installed; loaded or not is a reboot question, below.
	case user == "" && o.Loaded == d.version && o.Info.State != gpu.StateNoLibrary:
		// The module is right and the library is not where we look, and NVML cannot say
		// (built without cgo): nothing to install, but say so.
		diff.Warnings = append(diff.Warnings, "the userspace version cannot be checked: "+o.InstalledNote)
	case d.installer == nil && d.pkg == "":
		return nil, fmt.Errorf("the plan wants driver %s and the host has %s, and neither installer { url, sha256 } nor package says how to install it",
			d.version, describeHave(o))
	case d.installer != nil && o.Nouveau && d.blacklist:
		// NVIDIA's installer refuses to run while nouveau is loaded: blacklist, reboot,
		// then install. The reboot cause below says so.
		if det.blacklist != nil {
			diff.Warnings = append(diff.Warnings, fmt.Sprintf("driver %s installs after the reboot that unloads nouveau", d.version))
		}
	default:
		det.install = true
		det.replacing = o.Loaded != ""
		method := "installer"
		if d.pkg != "" {
			method = "package " + d.pkg
		}
		if have == "" {
			diff.Add(agent.Added("version", d.version).Because(agent.Creates, agent.ReasonMissing))
		} else {
			c := agent.Set("version", have, d.version)
			c.Note = "driver change through the " + method + "; GPU processes are stopped first"
			diff.Add(c.Because(agent.Replaces, agent.ReasonDiffers))
		}
		if ps := gpuProcesses(o.Info); det.replacing && len(ps) > 0 {
			w := fmt.Sprintf("%d processes use the GPUs: %s", len(ps), describeProcesses(d.host, ps))
			if d.host.StopGPUServers == nil {
				w += "; apply refuses to change the driver until they stop"
			} else {
				w += "; apply stops the agent's servers first"
			}
			diff.Warnings = append(diff.Warnings, w)
		}
	}

	// A reboot: only when nothing else is to be done first (after an install or a
	// blacklist, Apply re-observes and reboots as its last step itself).
	if !det.install && det.blacklist == nil {
		for _, c := range d.rebootCauses(o) {
			w, reboot := d.rebootVerdict(c, o, rec)
			if !reboot {
				diff.Warnings = append(diff.Warnings, w)
				continue
			}
			det.reboot = true
			ch := agent.Set("reboot", agent.Raw(c.reason), agent.Raw("rebooted"))
			ch.Note = `reboot = "allowed": the host reboots as the last step`
			diff.Add(ch.Because(agent.Restarts, agent.ReasonReboot))
		}
	}

	// Persistence mode, on a driver that is the wanted one and loaded.
	if d.persistence != nil && o.Loaded == d.version && user == d.version && !det.install {
		if o.Info.Source != gpu.SourceNVML || o.Info.State != gpu.StateOK {
			diff.Warnings = append(diff.Warnings, "persistence mode cannot be observed without NVML ("+o.Info.State.String()+", "+o.Info.Source+")")
		} else if off := persistenceDiffers(o.Info, *d.persistence); len(off) > 0 {
			det.pm = d.persistence
			c := agent.Set("persistence_mode", !*d.persistence, *d.persistence)
			c.Note = "GPU " + joinInts(off) + " (nvidia-smi -pm)"
			diff.Add(c.Because(agent.InPlace, agent.ReasonDiffers))
		}
	}

	// NVML's verdict, when the driver is the wanted one but the GPUs are not usable.
	if o.Loaded == d.version && user == d.version && o.Info.State != gpu.StateOK {
		diff.Warnings = append(diff.Warnings, gpuStateLine(o.Info))
	}
	return diff.Derive(), nil
}

// rebootVerdict says, for one cause, whether to reboot now or what to warn.
func (d *Driver) rebootVerdict(c rebootCause, o *driverObs, rec driverRecord) (warning string, reboot bool) {
	if !d.rebootAllowed {
		never := c.never
		if never == "" {
			never = "reboot the host to load it"
		}
		return fmt.Sprintf(`reboot required: %s (reboot = "never": %s)`, c.reason, never), false
	}
	r := rec.RebootRequested
	if r != nil && r.BootID == o.BootID {
		// At most one reboot per boot and agent start, whatever its cause: an agent
		// killed between its record and systemctl reboot asks again once restarted.
		if r.Agent == d.host.AgentStart {
			return fmt.Sprintf("reboot required: %s; the agent asked for a reboot at %s and the host has not gone down yet", c.reason, agent.HumanTime(r.At)), false
		}
		return "", true
	}
	if r != nil && r.Cause == c.key {
		return fmt.Sprintf("reboot required: %s, although the agent rebooted the host at %s for it: the reboot did not help (see the kernel log and %s), so the agent will not reboot again for it",
			c.reason, agent.HumanTime(r.At), d.installLogHint(rec)), false
	}
	return "", true
}

func (d *Driver) installLogHint(rec driverRecord) string {
	if rec.LastInstall != nil && rec.LastInstall.Log != "" {
		return rec.LastInstall.Log
	}
	return "the installer's log"
}

func describeHave(o *driverObs) string {
	switch {
	case o.Installed == "" && o.Loaded == "":
		return "no driver"
	case o.Installed == "" || o.Installed == o.Loaded:
		return o.Loaded + " loaded"
	case o.Loaded == "":
		return o.Installed + " installed, none loaded"
	}
	return fmt.Sprintf("%s installed, %s loaded", o.Installed, o.Loaded)
}

// persistenceDiffers returns the indices of GPUs whose persistence mode is known and not
// want.
func persistenceDiffers(info gpu.Info, want bool) []int {
	var idx []int
	for _, g := range info.GPUs {
		if g.PersistenceMode != nil && *g.PersistenceMode != want {
			idx = append(idx, g.Index)
		}
	}
	return idx
}

func joinInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = fmt.Sprint(n)
	}
	return strings.Join(parts, ", ")
}

// gpuStateLine renders an observed GPU state for the operator: the verdict, what to do,
// and what exactly was seen.
func gpuStateLine(info gpu.Info) string {
	s := "GPUs: " + info.State.String() + ": " + info.State.Message()
	if info.StateDetail != "" {
		s += " (" + info.StateDetail + ")"
	}
	return s
}

// Status shows the driver, the GPUs with their memory, and the processes using them.
func (d *Driver) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	o, err := observeDriver(ctx, d.host)
	if err != nil {
		return nil, err
	}
	o.GPUReboots = gpuRebootCauses(env, d.host)
	rec, err := d.load(env)
	if err != nil {
		return nil, err
	}
	st := &agent.Status{Metrics: map[string]float64{"gpus": float64(len(o.Info.GPUs))}}
	add := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	st.Series = gpuSeries(o.Info)
	for _, g := range o.Info.GPUs {
		// Deprecated, kept for one release (docs/service.md): the index in the name,
		// agent_nvidia_driver_gpu0_memory_used_bytes, which no query can aggregate.
		st.Metrics[fmt.Sprintf("gpu%d_memory_used_bytes", g.Index)] = float64(g.MemoryUsed)
		st.Metrics[fmt.Sprintf("gpu%d_memory_total_bytes", g.Index)] = float64(g.MemoryTotal)
		st.Metrics[fmt.Sprintf("gpu%d_processes", g.Index)] = float64(len(g.Processes))
	}
	if rec.RebootRequired != nil {
		st.Metrics["reboot_required"] = 1
	} else {
		st.Metrics["reboot_required"] = 0
	}

	loaded := "none"
	if o.Loaded != "" {
		loaded = o.Loaded
		if o.LoadedOpen {
			loaded += " (open kernel module)"
		}
	}
	add(agent.TextField("wanted", "wanted", d.version))
	add(agent.TextField("loaded", "loaded", o.Loaded).WithText(loaded))
	if o.Installed != "" {
		add(agent.TextField("installed", "installed", o.Installed).WithText(o.Installed + " (" + o.InstalledLib + ")"))
	} else {
		add(agent.TextField("installed", "installed", "").WithText("unknown: " + o.InstalledNote))
	}
	gpus := o.Info.State.String() + " (" + o.Info.Source + ")"
	if o.Info.CUDADriverVersion != "" {
		gpus += ", CUDA " + o.Info.CUDADriverVersion
	}
	add(agent.TextField("gpu_state", "gpu state", o.Info.State.String()).WithText(gpus))
	switch {
	case o.Nouveau && o.NouveauBlacklisted != "":
		add(agent.BoolField("nouveau_blacklisted", "nouveau", true).WithText("loaded, blacklisted in " + o.NouveauBlacklisted))
	case o.Nouveau:
		add(agent.BoolField("nouveau_blacklisted", "nouveau", false).WithText("loaded, not blacklisted"))
	}
	for _, g := range o.Info.GPUs {
		add(agent.TextField(fmt.Sprintf("gpu[%d]", g.Index), fmt.Sprintf("gpu %d", g.Index), describeDevice(g)))
		if len(g.Processes) > 0 {
			add(agent.NumberField(fmt.Sprintf("gpu_processes[%d]", g.Index), fmt.Sprintf("gpu %d processes", g.Index), len(g.Processes)).WithText(describeProcesses(d.host, g.Processes)))
		}
	}
	d.statusGPUFaults(add, st, env, o.Info.GPUs)
	if rec.LastInstall != nil {
		add(agent.TimeField("last_install_at", "last install", rec.LastInstall.At).WithText(fmt.Sprintf("%s via %s at %s, log %s", rec.LastInstall.Version, rec.LastInstall.Method,
			agent.HumanTime(rec.LastInstall.At), rec.LastInstall.Log)))
	}

	diff, err := d.decide(ctx, env, o, rec)
	if err != nil {
		st.Summary = err.Error()
		return st, nil
	}
	for i, w := range diff.Warnings {
		add(agent.TextField(fmt.Sprintf("warning[%d]", i+1), "warning", w))
	}
	if n := rec.RebootRequired; n != nil {
		for _, c := range d.rebootCauses(o) {
			if c.key == n.Cause {
				add(agent.TimeField("reboot_required_since", "reboot required since", n.At))
			}
		}
	}
	switch {
	case o.Info.State != gpu.StateOK && o.Loaded == d.version:
		st.Summary = gpuStateLine(o.Info)
	case diff.Action != agent.NoOp:
		st.Summary = "drift: " + driverDescribe(diff)
	case len(diff.Warnings) > 0:
		st.Summary = diff.Warnings[0]
	case o.Info.State != gpu.StateOK:
		st.Summary = gpuStateLine(o.Info)
	default:
		st.Healthy = true
		st.Summary = fmt.Sprintf("driver %s loaded, %s", o.Loaded, countGPUs(o.Info.GPUs))
	}
	return st, nil
}

func driverDescribe(d *agent.Diff) string {
	var attrs []string
	for _, c := range d.Changes {
		attrs = append(attrs, c.Attr)
	}
	return fmt.Sprintf("%s of [%s]", d.Action, strings.Join(attrs, " "))
}

func countGPUs(gs []gpu.Device) string {
	if len(gs) == 0 {
		return "no GPU"
	}
	names := map[string]int{}
	var order []string
	for _, g := range gs {
		if names[g.Name] == 0 {
			order = append(order, g.Name)
		}
		names[g.Name]++
	}
	slices.Sort(order)
	parts := make([]string, len(order))
	for i, n := range order {
		parts[i] = fmt.Sprintf("%d× %s", names[n], n)
	}
	return strings.Join(parts, ", ")
}

// describeDevice is one GPU's status line: name, bus id, memory, persistence mode.
// gpuSeries is each GPU's memory and compute processes as labelled series,
// agent_nvidia_driver_gpu_memory_used_bytes{resource, kind, gpu="0", uuid="GPU-…"}: one
// metric name for every GPU, so a query can sum, compare or alert across them, and
// labels to join on (the index nvidia-smi and CUDA_VISIBLE_DEVICES use, the UUID that
// DCGM's exporter and NVIDIA's device plugin report). A figure the observation does not
// know is left out rather than exported as 0: memory without NVML (or on a GPU whose
// memory NVML does not report), processes without NVML.
func gpuSeries(info gpu.Info) []agent.Series {
	var out []agent.Series
	for _, g := range info.GPUs {
		labels := func() map[string]string { return map[string]string{"gpu": strconv.Itoa(g.Index), "uuid": g.UUID} }
		if g.MemoryTotal > 0 {
			out = append(out,
				agent.Series{Name: "gpu_memory_used_bytes", Labels: labels(), Value: float64(g.MemoryUsed)},
				agent.Series{Name: "gpu_memory_total_bytes", Labels: labels(), Value: float64(g.MemoryTotal)})
		}
		if info.Source == gpu.SourceNVML {
			out = append(out, agent.Series{Name: "gpu_processes", Labels: labels(), Value: float64(len(g.Processes))})
		}
	}
	return out
}

func describeDevice(g gpu.Device) string {
	parts := []string{g.Name, g.PCIBusID}
	if g.UUID != "" {
		parts = append(parts, g.UUID)
	}
	if g.MemoryTotal > 0 {
		parts = append(parts, fmt.Sprintf("memory %s used of %s, %s free",
			bytesize.Format(g.MemoryUsed), bytesize.Format(g.MemoryTotal), bytesize.Format(g.MemoryFree)))
	} else {
		parts = append(parts, "memory not visible without NVML")
	}
	if g.PersistenceMode != nil {
		pm := "off"
		if *g.PersistenceMode {
			pm = "on"
		}
		parts = append(parts, "persistence mode "+pm)
	}
	return strings.Join(parts, ", ")
}
