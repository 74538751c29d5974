package resources

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// ContainerConfig is the `container` block.
type ContainerConfig struct {
	Name            *string           `hcl:"name,optional"`
	Image           string            `hcl:"image"`
	Type            *string           `hcl:"type,optional"`
	Profiles        *[]string         `hcl:"profiles,optional"`
	Config          map[string]string `hcl:"config,optional"`
	Description     *string           `hcl:"description,optional"`
	Replace         *string           `hcl:"replace,optional"`
	Target          *string           `hcl:"target,optional"`
	NvidiaRuntime   *bool             `hcl:"nvidia_runtime,optional"`
	NvidiaUserspace *string           `hcl:"nvidia_userspace,optional"`
	// NvidiaInstaller installs nvidia_userspace inside the instance when it differs.
	NvidiaInstaller *ContainerInstallerConfig `hcl:"nvidia_installer,block"`
	Running         *bool                     `hcl:"running,optional"`
	StopTimeout     *string                   `hcl:"stop_timeout,optional"`
	Ensure          *string                   `hcl:"ensure,optional"` // "absent": container_delete.go

	GPUs    []ContainerGPUConfig    `hcl:"gpu,block"`
	Disks   []ContainerDiskConfig   `hcl:"disk,block"`
	Devices []ContainerDeviceConfig `hcl:"device,block"`
}

// ContainerInstallerConfig is the `nvidia_installer` block: NVIDIA's .run installer for
// the userspace driver, run inside the instance with --no-kernel-module (the same file
// as the nvidia_driver block's installer).
type ContainerInstallerConfig struct {
	URL    string   `hcl:"url"`
	SHA256 string   `hcl:"sha256"`
	Args   []string `hcl:"args,optional"`
}

// ContainerGPUConfig is a `gpu "NAME"` block: an Incus gpu device. Every field is
// optional; none at all passes every GPU through.
type ContainerGPUConfig struct {
	Name      string  `hcl:"name,label"`
	PCI       *string `hcl:"pci,optional"`
	ID        *string `hcl:"id,optional"`
	VendorID  *string `hcl:"vendorid,optional"`
	ProductID *string `hcl:"productid,optional"`
	GPUType   *string `hcl:"gputype,optional"`
	UID       *string `hcl:"uid,optional"`
	GID       *string `hcl:"gid,optional"`
	Mode      *string `hcl:"mode,optional"`
}

// ContainerDiskConfig is a `disk "NAME"` block: a host directory bind-mounted into the
// instance.
type ContainerDiskConfig struct {
	Name     string `hcl:"name,label"`
	Source   string `hcl:"source"`
	Path     string `hcl:"path"`
	ReadOnly *bool  `hcl:"readonly,optional"`
	Shift    *bool  `hcl:"shift,optional"`
}

// ContainerDeviceConfig is a `device "NAME"` block: any other Incus device, given as its
// type and its options verbatim.
type ContainerDeviceConfig struct {
	Name    string            `hcl:"name,label"`
	Type    string            `hcl:"type"`
	Options map[string]string `hcl:"options,optional"`
}

// Container is an Incus instance (a system container, or a VM) reached through the
// Incus REST API.
//
// The plan manages the config keys and devices it names, the profiles, the description
// (when set) and whether the instance runs. Keys and devices it does not name are left
// alone, except those an earlier apply set (recorded in the state), which are removed
// when they leave the plan. Server-owned keys (volatile.*, image.*) are never compared
// and always preserved. The image and the type are fixed at creation: changing them is
// a replace, refused unless replace = "allowed".
type Container struct {
	addr         string
	name         string
	image        string
	itype        string
	profiles     []string
	config       map[string]string // desired own config, nvidia.runtime included
	devices      map[string]map[string]string
	deviceKind   map[string]string // device name → "gpu", "disk" or "device", for diffs
	description  *string
	allowReplace bool
	target       string
	nvidiaRT     bool
	userspace    string // wanted NVIDIA userspace driver version; "" = not checked
	installer    *ContainerInstallerConfig
	running      bool
	stopTimeout  time.Duration
	secretConf   func(key string) bool // config[key] derives from a sensitive variable: never shown

	host    Host
	clients *sync.Map // Incus socket path → *incus.Client, shared by its views (liveView)
	base    string    // the plan's instance name, when name is its migration pair (container_migrate.go)

	deletion // ensure = "absent", agent destroy, an orphan: container_delete.go
}

var (
	_ agent.Resource = (*Container)(nil)
	_ agent.Statuser = (*Container)(nil)
)

// sensitiveConfig reports whether the plan's config[key] derives from a sensitive
// variable (never, for a container built from its record alone).
func (k *Container) sensitiveConfig(key string) bool {
	return k.secretConf != nil && k.secretConf(key)
}

// ContainerKind is the `container` resource kind, acting on h.
func ContainerKind(h Host) agent.Kind {
	k := agent.NewKind("container", func(r *plans.Resource, c *ContainerConfig) (agent.Resource, hcl.Diagnostics) {
		res, diags := bindContainer(r, c)
		if res != nil {
			res.host = h
			diags = append(diags, res.bindEnsure(r, c.Ensure)...)
		}
		if diags.HasErrors() {
			return nil, diags
		}
		return res, diags
	})
	k.Orphan = func(addr string, st *state.Scoped) (agent.Resource, error) { return orphanContainer(h, addr, st) }
	return k
}

// serverOwned reports whether Incus sets and owns a config key: never diffed, never
// written by the agent, always carried over by a PUT.
func serverOwned(key string) bool {
	return strings.HasPrefix(key, "volatile.") || strings.HasPrefix(key, "image.")
}

// restartKeys are config keys (or prefixes ending in ".") that a running container
// only picks up when it starts: LXC reads them while setting the container up.
var restartKeys = []string{
	"raw.lxc", "raw.idmap", "raw.apparmor", "raw.seccomp",
	"security.privileged", "security.nesting", "security.idmap.", "security.syscalls.",
	"nvidia.", "linux.kernel_modules", "linux.sysctl.", "limits.kernel.",
}

func needsRestart(key string) bool {
	for _, k := range restartKeys {
		if key == k || strings.HasSuffix(k, ".") && strings.HasPrefix(key, k) {
			return true
		}
	}
	return false
}

func bindContainer(r *plans.Resource, c *ContainerConfig) (*Container, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	bad := func(rng hcl.Range, summary, detail string) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr()})
	}
	k := &Container{
		addr: r.Addr, name: r.Name, image: c.Image, itype: "container",
		profiles: []string{"default"}, config: map[string]string{}, secretConf: func(key string) bool { return r.SensitiveKey("config", key) },
		devices: map[string]map[string]string{}, deviceKind: map[string]string{},
		description: c.Description, target: deref(c.Target), userspace: deref(c.NvidiaUserspace),
		running: true, stopTimeout: 30 * time.Second, clients: new(sync.Map),
	}
	if c.Name != nil {
		k.name = *c.Name
	}
	if !validInstanceName(k.name) {
		bad(r.Range("name"), "Invalid instance name",
			fmt.Sprintf("%q is not a valid Incus instance name: 1 to 63 letters, digits and dashes, starting with a letter, not ending with a dash.", k.name))
	}
	if strings.TrimSpace(c.Image) == "" {
		bad(r.Range("image"), "Empty image", "image names a local image alias, a fingerprint, or remote:alias.")
	}
	if c.Type != nil {
		switch *c.Type {
		case "container", "virtual-machine":
			k.itype = *c.Type
		default:
			bad(r.Range("type"), "Invalid instance type", fmt.Sprintf("type is \"container\" or \"virtual-machine\", not %q.", *c.Type))
		}
	}
	if c.Profiles != nil {
		k.profiles = slices.Clone(*c.Profiles)
	}
	switch v := deref(c.Replace); v {
	case "", "refuse":
	case "allowed":
		k.allowReplace = true
	default:
		bad(r.Range("replace"), "Invalid replace", fmt.Sprintf("replace is \"refuse\" (the default) or \"allowed\", not %q.", v))
	}
	if c.Running != nil {
		k.running = *c.Running
	}
	if c.StopTimeout != nil {
		d, err := time.ParseDuration(*c.StopTimeout)
		if err != nil || d < time.Second {
			bad(r.Range("stop_timeout"), "Invalid stop_timeout", fmt.Sprintf("%q is not a duration of at least 1s, such as \"30s\".", *c.StopTimeout))
			diags[len(diags)-1].Extra = plans.OwnValue
		} else {
			k.stopTimeout = d
		}
	}
	for key, v := range c.Config {
		if serverOwned(key) {
			bad(r.Range("config"), "Server-owned config key",
				fmt.Sprintf("%q is set by Incus itself (volatile.* and image.* keys); the agent never writes it. Remove it from config.", key))
			continue
		}
		k.config[key] = v
	}
	if c.NvidiaRuntime != nil {
		if _, ok := c.Config["nvidia.runtime"]; ok {
			bad(r.Range("nvidia_runtime"), "nvidia.runtime set twice", "Set nvidia_runtime or config[\"nvidia.runtime\"], not both.")
		}
		k.nvidiaRT = *c.NvidiaRuntime
		k.config["nvidia.runtime"] = fmt.Sprint(*c.NvidiaRuntime)
	} else if c.Config["nvidia.runtime"] == "true" {
		k.nvidiaRT = true
	}
	if k.nvidiaRT && c.Config["security.privileged"] == "true" {
		bad(r.Range("nvidia_runtime"), "nvidia_runtime in a privileged container",
			"The NVIDIA container runtime hook refuses privileged containers (security.privileged = \"true\"): use an unprivileged container, or pass the GPU with gpu blocks and install the userspace driver inside (nvidia_userspace).")
	}
	if c.NvidiaInstaller != nil {
		k.installer = c.NvidiaInstaller
		if k.userspace == "" {
			bad(r.Range("nvidia_installer"), "Installer without a version", "nvidia_installer installs nvidia_userspace: set nvidia_userspace = nvidia_driver.NAME.version.")
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(k.installer.SHA256) {
			bad(r.Range("nvidia_installer", "sha256"), "Invalid sha256", "sha256 is the installer's 64 lower-case hex digits: the agent runs nothing it has not verified.")
		}
		if u, err := url.Parse(k.installer.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") {
			bad(r.Range("nvidia_installer", "url"), "Invalid installer URL", fmt.Sprintf("%q is not an http(s) URL.", k.installer.URL))
		}
	}
	if k.userspace != "" && !isDriverVersion(k.userspace) {
		bad(r.Range("nvidia_userspace"), "Invalid driver version", fmt.Sprintf("%q is not an NVIDIA driver version such as \"580.95.05\".", k.userspace))
	}

	addDevice := func(kind, name string, rng hcl.Range, dev map[string]string) {
		if prev, ok := k.deviceKind[name]; ok {
			bad(rng, "Duplicate device", fmt.Sprintf("A %s named %q is already declared in this container; device names are shared by gpu, disk and device blocks.", prev, name))
			return
		}
		if !validDeviceName(name) {
			bad(rng, "Invalid device name", fmt.Sprintf("%q is not a valid device name: letters, digits, dashes, underscores and dots.", name))
			return
		}
		k.deviceKind[name] = kind
		k.devices[name] = dev
	}
	for _, g := range c.GPUs {
		dev := map[string]string{"type": "gpu"}
		set := func(key string, v *string) {
			if v != nil && *v != "" {
				dev[key] = *v
			}
		}
		if g.PCI != nil {
			norm := gpu.NormalizePCIBusID(*g.PCI)
			if !strings.Contains(norm, ":") {
				bad(r.Range("gpu", "pci"), "Invalid PCI address", fmt.Sprintf("%q is not a PCI address such as \"0000:01:00.0\" (see nvidia-smi --query-gpu=pci.bus_id or ls /dev/dri/by-path).", *g.PCI))
			}
			g.PCI = &norm
		}
		set("pci", g.PCI)
		set("id", g.ID)
		set("vendorid", g.VendorID)
		set("productid", g.ProductID)
		set("gputype", g.GPUType)
		set("uid", g.UID)
		set("gid", g.GID)
		set("mode", g.Mode)
		addDevice("gpu", g.Name, r.Range("gpu"), dev)
	}
	for _, d := range c.Disks {
		if !filepath.IsAbs(d.Source) {
			bad(r.Range("disk", "source"), "Relative disk source",
				fmt.Sprintf("source %q must be an absolute host directory; for a storage volume use a device block with type = \"disk\" and options pool and source.", d.Source))
		}
		if !strings.HasPrefix(d.Path, "/") {
			bad(r.Range("disk", "path"), "Relative disk path", fmt.Sprintf("path %q is the mount point inside the instance and must be absolute.", d.Path))
		}
		dev := map[string]string{"type": "disk", "source": d.Source, "path": d.Path}
		if deref(d.ReadOnly) {
			dev["readonly"] = "true"
		}
		if deref(d.Shift) {
			dev["shift"] = "true"
		}
		addDevice("disk", d.Name, r.Range("disk"), dev)
	}
	for _, d := range c.Devices {
		dev := map[string]string{}
		maps.Copy(dev, d.Options)
		if _, ok := d.Options["type"]; ok {
			bad(r.Range("device", "options"), "type in options", "A device's type is its own attribute (type = \"proxy\"), not an option.")
		}
		if d.Type == "" {
			bad(r.Range("device", "type"), "Empty device type", "Give the Incus device type: nic, proxy, unix-char, disk, …")
		}
		dev["type"] = d.Type
		addDevice("device", d.Name, r.Range("device"), dev)
	}
	return k, diags
}

func validInstanceName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[len(s)-1] == '-' {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case (c >= '0' && c <= '9' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

func validDeviceName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func isDriverVersion(s string) bool {
	if s == "" || strings.Trim(s, "0123456789.") != "" || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") {
		return false
	}
	return strings.Contains(s, ".")
}

// containerRecord is the container's state record: what the last apply created and set,
// so that a key or device that leaves the plan is removed and an alias that moves to a
// newer image does not force a replace.
//
// The record is of one instance: its name and volatile.uuid. A record of another instance
// (the plan's name changed, or the instance was deleted and made again by someone else)
// claims nothing on the one observed, so the keys and devices found there are left alone.
type containerRecord struct {
	Instance    string   `json:"instance,omitempty"` // the instance's name
	UUID        string   `json:"uuid,omitempty"`     // its volatile.uuid, once known
	Image       string   `json:"image"`              // the plan's image attribute at creation
	Fingerprint string   `json:"fingerprint"`        // what it resolved to
	Config      []string `json:"config"`             // config keys the agent manages
	Devices     []string `json:"devices"`            // device names the agent manages

	// A migration (container_migrate.go): Base is the plan's instance name, and
	// Instance the live one of the pair (Base or Base-b); Building is the pair while it
	// is built (never live yet); Retiring is the old instance, with its uuid and member,
	// until it is stopped and deleted.
	Base           string `json:"base,omitempty"`
	Building       string `json:"building,omitempty"`
	Retiring       string `json:"retiring,omitempty"`
	RetiringUUID   string `json:"retiring_uuid,omitempty"`
	RetiringMember string `json:"retiring_member,omitempty"`
}

// leftover is the other half of a migration the record still holds: the retiring
// instance, or a pair built but never made live. "" when none.
func (r containerRecord) leftover() string {
	if r.Retiring != "" {
		return r.Retiring
	}
	if r.Building != "" && r.Building != r.Instance {
		return r.Building
	}
	return ""
}

// of reports whether the record is of the instance named name whose volatile.uuid is
// uuid. Records from before names and uuids were kept are taken as the instance's.
func (r containerRecord) of(name, uuid string) bool {
	return (r.Instance == "" || r.Instance == name) && (r.UUID == "" || uuid == "" || r.UUID == uuid)
}

// containerDetail is what Check decided, for Apply.
type containerDetail struct {
	create, replace bool
	remove, forget  bool   // delete the instance (ensure = "absent"); drop the record only
	fingerprint     string // resolved image, for create and replace
	imageRecord     string // the image attribute to record (the plan's, or the recorded one)
	uuid            string // the observed instance's volatile.uuid

	put        bool
	setConfig  map[string]string
	delConfig  []string
	setDevices map[string]map[string]string
	delDevices []string
	profiles   []string // nil: unchanged
	descr      *string

	// A target change (container_migrate.go): move a stopped instance, or build the
	// pair on the target (make before break); from is the member it is on now.
	migrate, move bool
	pair, from    string

	restart bool // stop before the PUT and start after it
	start   bool
	stop    bool

	userspaceErr string // the userspace driver inside does not match, and nothing installs it
	// installUserspace runs nvidia_installer inside the instance.
	installUserspace bool
}

// client returns the Incus client for the plan's socket.
func (k *Container) client(env *agent.Env) *incus.Client {
	explicit := ""
	if env != nil && env.Plan != nil {
		explicit = env.Plan.Agent.IncusSocket
	}
	sock := incus.SocketPath(explicit)
	if c, ok := k.clients.Load(sock); ok {
		return c.(*incus.Client)
	}
	c, _ := k.clients.LoadOrStore(sock, incus.New(sock))
	return c.(*incus.Client)
}

// reachErr adds the fix to an error that is not an answer of Incus (no daemon at the
// socket, permission denied).
func reachErr(c *incus.Client, err error) error {
	var ie *incus.Error
	if errors.As(err, &ie) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w (is incusd running and is %s its socket? set agent { incus_socket } or INCUS_SOCKET)", err, c.Socket())
}

// resolveImage turns the image attribute into a local image fingerprint.
func resolveImage(ctx context.Context, c *incus.Client, image string) (string, error) {
	name := image
	if remote, alias, ok := strings.Cut(image, ":"); ok {
		if remote != "local" {
			return "", fmt.Errorf("image %q names the remote %q, which is not configured for the agent: it creates instances only from images its Incus daemon holds. Copy the image first (incus image copy %s local: --alias %s) and write image = %q",
				image, remote, image, alias, alias)
		}
		name = alias
	}
	a, err := c.GetImageAlias(ctx, name)
	if err == nil {
		return a.Target, nil
	}
	if !incus.IsNotFound(err) {
		return "", reachErr(c, err)
	}
	if len(name) >= 12 && strings.Trim(strings.ToLower(name), "0123456789abcdef") == "" {
		img, ferr := c.GetImage(ctx, name)
		if ferr == nil {
			return img.Fingerprint, nil
		}
		if !incus.IsNotFound(ferr) {
			return "", ferr
		}
	}
	return "", fmt.Errorf("image %q: no local image has that alias or fingerprint (incus image list shows what the daemon holds)", image)
}

// Check observes the instance and compares it with the plan; a migration's break work
// left (its retiring instance) is part of what it reports.
func (k *Container) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if k.absent {
		return k.checkAbsent(ctx, env)
	}
	live, rec, err := k.liveView(env)
	if err != nil {
		return nil, err
	}
	d, err := live.observe(ctx, env, rec)
	if d != nil {
		d.Unfinished = k.unfinished(rec)
	}
	return d, err
}

// observe is Check on the live instance, rec its record.
func (k *Container) observe(ctx context.Context, env *agent.Env, rec containerRecord) (*agent.Diff, error) {
	var err error
	c := k.client(env)
	inst, _, err := c.GetInstance(ctx, k.name)
	if incus.IsNotFound(err) {
		return k.createDiff(ctx, c)
	}
	if _, oerr := offlineMember(ctx, c, k.name, err); oerr != nil {
		return nil, oerr
	}
	if err != nil {
		return nil, reachErr(c, err)
	}
	if member := instanceMember(inst); member != "" && k.target != "" && member != k.target {
		if err := memberOnline(ctx, c, member, k.name); err != nil {
			return nil, err
		}
		return k.migrateDiff(ctx, c, env, inst, rec)
	}
	if err := k.placement(ctx, c, inst); err != nil {
		return nil, err
	}
	uuid := inst.Config["volatile.uuid"]
	if !rec.of(k.name, uuid) {
		rec = containerRecord{} // another instance's record: nothing here is claimed
	}
	det := &containerDetail{setConfig: map[string]string{}, setDevices: map[string]map[string]string{},
		imageRecord: rec.Image, fingerprint: rec.Fingerprint, uuid: uuid}
	d := &agent.Diff{Detail: det}

	// What cannot change in place.
	var replace []agent.Change
	if inst.Type != k.itype {
		replace = append(replace, agent.Set("type", inst.Type, k.itype).Because(agent.Replaces, agent.ReasonImmutable))
	}
	base := inst.Config["volatile.base_image"]
	sameImage := rec.Image == k.image && rec.Fingerprint != "" && rec.Fingerprint == base
	var fp string
	if !sameImage {
		fp, err = resolveImage(ctx, c, k.image)
		if err != nil {
			return nil, err
		}
		switch {
		case fp == base:
			det.imageRecord, det.fingerprint = k.image, base
		case base == "":
			d.Warnings = append(d.Warnings, fmt.Sprintf("instance %s records no base image (volatile.base_image); image %q is not compared", k.name, k.image))
		default:
			ch := agent.Set("image", shortFP(base), fmt.Sprintf("%s (%s)", k.image, shortFP(fp)))
			replace = append(replace, ch.Because(agent.Replaces, agent.ReasonImmutable))
		}
	} else if now, err := resolveImage(ctx, c, k.image); err == nil && now != base {
		d.Warnings = append(d.Warnings, fmt.Sprintf("image %q now points to %s; instance %s was created from %s and is not replaced for that (write the new fingerprint as image, with replace = \"allowed\", to rebuild it)",
			k.image, shortFP(now), k.name, shortFP(base)))
	}
	if len(replace) > 0 {
		if !k.allowReplace {
			var what []string
			for _, ch := range replace {
				what = append(what, fmt.Sprintf("%s %s → %s", ch.Attr, agent.Render(ch.Old), agent.Render(ch.New)))
			}
			// Terminal: retrying cannot help until the plan changes (agent run stops trying).
			return nil, agent.Terminal(fmt.Errorf("instance %s needs a replace (%s): Incus cannot change an instance's image or type in place, and replace = \"refuse\". Set replace = \"allowed\" to delete and recreate it (its root filesystem and snapshots are lost; host directories of disk devices are kept)",
				k.name, strings.Join(what, ", ")))
		}
		d.Changes = replace
		det.replace = true
		det.fingerprint = fp
		det.imageRecord = k.image
		d.Add(agent.Change{Attr: "devices", Note: "disk devices' host directories are kept", New: agent.Raw(fmt.Sprintf("(%d declared)", len(k.devices))), HasNew: true,
			Effect: agent.Replaces, Reason: agent.ReasonImmutable})
		return d.Derive(), nil
	}

	if k.nvidiaRT {
		priv := inst.ExpandedConfig["security.privileged"]
		if v, ok := k.config["security.privileged"]; ok {
			priv = v
		}
		if priv == "true" {
			return nil, fmt.Errorf("nvidia_runtime = true in instance %s, which is privileged (security.privileged = \"true\", from its config or a profile): the NVIDIA container runtime hook refuses privileged containers. Make it unprivileged, or drop nvidia_runtime and use gpu blocks with nvidia_userspace", k.name)
		}
	}

	restart := false
	// Config: the keys the plan names, plus removal of keys an earlier apply set.
	for _, key := range containerKeys(k.config) {
		want := k.config[key]
		have, ok := inst.Config[key]
		if ok && have == want {
			continue
		}
		ch := agent.Added(fmt.Sprintf("config[%q]", key), want)
		if ok {
			ch = agent.Set(fmt.Sprintf("config[%q]", key), have, want)
		}
		ch.Sensitive = k.sensitiveConfig(key)
		if needsRestart(key) {
			ch.Note = "restart"
			restart = true
		}
		d.Add(ch)
		det.setConfig[key] = want
	}
	for _, key := range rec.Config {
		if _, planned := k.config[key]; planned || serverOwned(key) {
			continue
		}
		if have, ok := inst.Config[key]; ok {
			ch := agent.Removed(fmt.Sprintf("config[%q]", key), have)
			if needsRestart(key) {
				ch.Note = "restart"
				restart = true
			}
			d.Add(ch)
			det.delConfig = append(det.delConfig, key)
		}
	}
	var unmanaged []string
	for _, key := range containerKeys(inst.Config) {
		if _, planned := k.config[key]; !planned && !serverOwned(key) && !slices.Contains(rec.Config, key) {
			unmanaged = append(unmanaged, "config "+key)
		}
	}

	// Devices, the same way.
	for _, name := range containerKeys(k.devices) {
		want := k.devices[name]
		have, ok := inst.Devices[name]
		if ok && maps.Equal(have, want) {
			continue
		}
		attr := fmt.Sprintf("%s[%q]", k.deviceKind[name], name)
		ch := agent.Change{Attr: attr, New: incusDevice(want), HasNew: true}
		if ok {
			ch.Old, ch.HasOld = incusDevice(have), true
		}
		if k.deviceRestart(want, have) {
			ch.Note = "restart"
			restart = true
		}
		d.Add(ch)
		det.setDevices[name] = want
	}
	for _, name := range rec.Devices {
		if _, planned := k.devices[name]; planned {
			continue
		}
		if have, ok := inst.Devices[name]; ok {
			ch := agent.Change{Attr: fmt.Sprintf("device[%q]", name), Old: incusDevice(have), HasOld: true}
			if k.deviceRestart(nil, have) {
				ch.Note = "restart"
				restart = true
			}
			d.Add(ch)
			det.delDevices = append(det.delDevices, name)
		}
	}
	for _, name := range containerKeys(inst.Devices) {
		if _, planned := k.devices[name]; !planned && !slices.Contains(rec.Devices, name) {
			unmanaged = append(unmanaged, "device "+name)
		}
	}
	if len(unmanaged) > 0 {
		d.Warnings = append(d.Warnings, fmt.Sprintf("instance %s has settings the plan does not name, left as they are: %s", k.name, strings.Join(unmanaged, ", ")))
	}

	if !slices.Equal(inst.Profiles, k.profiles) {
		d.Add(agent.Set("profiles", inst.Profiles, k.profiles))
		det.profiles = k.profiles
	}
	if k.description != nil && inst.Description != *k.description {
		d.Add(agent.Set("description", inst.Description, *k.description))
		det.descr = k.description
	}
	det.put = len(d.Changes) > 0

	isRunning := inst.StatusCode == incus.StatusRunning
	switch {
	case inst.StatusCode == incus.StatusFrozen:
		return nil, fmt.Errorf("instance %s is frozen: unfreeze it (incus start %s) and plan again", k.name, k.name)
	case k.running && !isRunning:
		ch := agent.Set("running", false, true)
		ch.Note = "starts the instance"
		d.Add(ch)
		det.start = true
	case !k.running && isRunning:
		ch := agent.Set("running", true, false)
		ch.Note = "stops the instance"
		d.Add(ch)
		det.stop = true
	}
	det.restart = restart && isRunning && k.running

	if k.userspace != "" && isRunning && k.running {
		have, err := k.userspaceVersion(ctx, c)
		if err != nil {
			return nil, err
		}
		if have != k.userspace {
			old := have
			if old == "" {
				old = "(none)"
			}
			ch := agent.Set("nvidia_userspace", old, k.userspace)
			if k.installer != nil {
				ch.Note = "installed inside with the verified installer, --no-kernel-module"
				det.installUserspace = true
			} else {
				ch.Note = "must match the host's kernel module; no nvidia_installer to install it"
				det.userspaceErr = k.userspaceFix(have)
			}
			d.Add(ch)
		}
	}

	if len(d.Changes) == 0 {
		d = agent.NoChange()
	}
	if rec.Retiring != "" {
		d.Warnings = append(d.Warnings, fmt.Sprintf("migration: instance %s on member %s retires (stopped and deleted) once every resource that depends on this container verified in %s",
			rec.Retiring, noneIfEmpty(rec.RetiringMember), k.name))
	}
	if len(d.Changes) == 0 {
		return d, nil
	}
	// A key or device that needs a restart restarts only an instance that runs and stays
	// running; otherwise it is set in place.
	for i := range d.Changes {
		if d.Changes[i].Note == "restart" {
			d.Changes[i].Note = ""
			if det.restart {
				d.Changes[i].Effect = agent.Restarts
			}
		}
	}
	return d.Derive(), nil
}

// deviceRestart reports whether changing a device from have to want needs the instance
// restarted: GPUs (CUDA enumerates devices when a process starts, and the NVIDIA
// runtime hook runs at container start), and every device of a VM.
func (k *Container) deviceRestart(want, have map[string]string) bool {
	return k.itype == "virtual-machine" || want["type"] == "gpu" || have["type"] == "gpu"
}

func (k *Container) createDiff(ctx context.Context, c *incus.Client) (*agent.Diff, error) {
	fp, err := resolveImage(ctx, c, k.image)
	if err != nil {
		return nil, err
	}
	if err := k.checkTarget(ctx, c); err != nil {
		return nil, err
	}
	if k.nvidiaRT {
		if err := k.checkProfilesPrivileged(ctx, c); err != nil {
			return nil, err
		}
	}
	det := &containerDetail{create: true, fingerprint: fp, imageRecord: k.image, start: k.running}
	d := &agent.Diff{Detail: det}
	d.Add(agent.Added("name", k.name))
	d.Add(agent.Added("image", fmt.Sprintf("%s (%s)", k.image, shortFP(fp))))
	if k.itype != "container" {
		d.Add(agent.Added("type", k.itype))
	}
	d.Add(agent.Added("profiles", k.profiles))
	if k.description != nil {
		d.Add(agent.Added("description", *k.description))
	}
	if k.target != "" {
		d.Add(agent.Added("target", k.target))
	}
	for _, key := range containerKeys(k.config) {
		ch := agent.Added(fmt.Sprintf("config[%q]", key), k.config[key])
		ch.Sensitive = k.sensitiveConfig(key)
		d.Add(ch)
	}
	for _, name := range containerKeys(k.devices) {
		d.Add(agent.Change{Attr: fmt.Sprintf("%s[%q]", k.deviceKind[name], name), New: incusDevice(k.devices[name]), HasNew: true})
	}
	d.Add(agent.Added("running", k.running))
	if k.userspace != "" {
		ch := agent.Added("nvidia_userspace", k.userspace)
		ch.Note = "checked once the instance runs"
		d.Add(ch)
	}
	for i := range d.Changes {
		d.Changes[i] = d.Changes[i].Because(agent.Creates, agent.ReasonMissing)
	}
	return d.Derive(), nil
}

// checkProfilesPrivileged refuses nvidia_runtime when a profile makes the container
// privileged and the plan's config does not say otherwise.
func (k *Container) checkProfilesPrivileged(ctx context.Context, c *incus.Client) error {
	if _, ok := k.config["security.privileged"]; ok {
		return nil // bind refused "true"
	}
	for _, p := range k.profiles {
		var prof struct {
			Config map[string]string `json:"config"`
		}
		if err := c.Query(ctx, http.MethodGet, "/1.0/profiles/"+p, nil, &prof); err != nil {
			if incus.IsNotFound(err) {
				return fmt.Errorf("profile %q does not exist on the Incus daemon", p)
			}
			return err
		}
		if prof.Config["security.privileged"] == "true" {
			return fmt.Errorf("nvidia_runtime = true, but profile %q makes the container privileged (security.privileged = \"true\"): the NVIDIA container runtime hook refuses privileged containers. Set config = { \"security.privileged\" = \"false\" } or drop nvidia_runtime", p)
		}
	}
	return nil
}

// Apply creates, updates, restarts or replaces the instance as Check decided.
func (k *Container) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) error {
	det, ok := d.Detail.(*containerDetail)
	if !ok {
		return fmt.Errorf("internal error: container detail is %T", d.Detail)
	}
	if k.absent {
		return k.applyAbsent(ctx, env, det)
	}
	k, _, err := k.liveView(env)
	if err != nil {
		return err
	}
	c := k.client(env)
	switch {
	case det.move:
		return k.applyMove(ctx, c, env, det)
	case det.migrate:
		return k.applyMigrate(ctx, c, env, det)
	}
	logf := func(msg string, args ...any) {
		if env != nil && env.Log != nil {
			env.Log.Info(msg, args...)
		}
	}
	switch {
	case det.replace:
		logf("replacing instance", "instance", k.name)
		if err := k.stopAndDelete(ctx, c, env); err != nil {
			return err
		}
		fallthrough
	case det.create:
		if err := k.saveIntent(env, det); err != nil {
			return err
		}
		if err := c.CreateInstance(ctx, k.post(det.fingerprint)); err != nil {
			return err
		}
		det.uuid = ""
		if inst, _, err := c.GetInstance(ctx, k.name); err == nil {
			det.uuid = inst.Config["volatile.uuid"]
		}
		if err := k.save(env, det); err != nil {
			return err
		}
		if k.running {
			if err := k.start(ctx, c); err != nil {
				return err
			}
		}
		return k.verifyUserspace(ctx, c, env)
	}

	if det.restart || det.stop {
		if err := k.stop(ctx, c, env); err != nil {
			return err
		}
	}
	if det.put {
		if err := k.saveIntent(env, det); err != nil {
			return err
		}
		if err := k.put(ctx, c, det); err != nil {
			return err
		}
	}
	if err := k.save(env, det); err != nil {
		return err
	}
	if det.restart || det.start {
		if err := k.start(ctx, c); err != nil {
			return err
		}
		// Check could not probe a stopped instance, and a restart can change what the
		// probe sees: probe now, and install when an installer is declared.
		return k.verifyUserspace(ctx, c, env)
	}
	if det.installUserspace {
		return k.installUserspace(ctx, c, env)
	}
	if det.userspaceErr != "" {
		return errors.New(det.userspaceErr)
	}
	return nil
}

// Timeout gives a container that installs the NVIDIA userspace driver the driver's own
// step budget: the download, the push and the installer run in one step, and a step cut
// short leaves the installer running inside while the next pass would start another.
// Other containers keep the engine's default.
func (k *Container) Timeout() time.Duration {
	if k.installer != nil {
		return DriverTimeout
	}
	return 0
}

// post is the creation request.
func (k *Container) post(fingerprint string) incus.InstancesPost {
	devs := make(map[string]map[string]string, len(k.devices))
	for n, dev := range k.devices {
		devs[n] = maps.Clone(dev)
	}
	return incus.InstancesPost{
		Name:   k.name,
		Type:   k.itype,
		Source: incus.InstanceSource{Fingerprint: fingerprint},
		Target: k.target,
		InstancePut: incus.InstancePut{
			Config:      maps.Clone(k.config),
			Devices:     devs,
			Profiles:    slices.Clone(k.profiles),
			Description: deref(k.description),
		},
	}
}

// put changes the instance in place: GET, change only what the plan manages, PUT with
// the ETag. Everything else (volatile.* keys, profiles when unmanaged, other devices)
// goes back exactly as read. A concurrent change (412) is retried on fresh data: the
// changes are the plan's values, not derived from the stale read.
func (k *Container) put(ctx context.Context, c *incus.Client, det *containerDetail) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var inst *incus.Instance
		var etag string
		inst, etag, err = c.GetInstance(ctx, k.name)
		if err != nil {
			return err
		}
		put := inst.InstancePut
		if put.Config == nil {
			put.Config = map[string]string{}
		}
		if put.Devices == nil {
			put.Devices = map[string]map[string]string{}
		}
		maps.Copy(put.Config, det.setConfig)
		for _, key := range det.delConfig {
			delete(put.Config, key)
		}
		for n, dev := range det.setDevices {
			put.Devices[n] = maps.Clone(dev)
		}
		for _, n := range det.delDevices {
			delete(put.Devices, n)
		}
		if det.profiles != nil {
			put.Profiles = slices.Clone(det.profiles)
		}
		if det.descr != nil {
			put.Description = *det.descr
		}
		err = c.UpdateInstance(ctx, k.name, put, etag)
		if !incus.HasStatus(err, http.StatusPreconditionFailed) {
			break
		}
	}
	if err != nil {
		return k.withHostGPUs(ctx, err, det.setDevices)
	}
	return nil
}

// save records what the agent manages now.
func (k *Container) save(env *agent.Env, det *containerDetail) error {
	if env == nil || env.State == nil {
		return nil
	}
	var rec containerRecord
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	if det.imageRecord != "" {
		rec.Image, rec.Fingerprint = det.imageRecord, det.fingerprint
	}
	rec.Instance, rec.UUID, rec.Base = k.name, det.uuid, k.planName()
	rec.Config = containerKeys(k.config)
	rec.Devices = containerKeys(k.devices)
	return env.State.Save(rec)
}

// saveIntent records, before a create or a PUT, every key and device the agent is about to
// manage on top of those it already did. A kill between the change and save would
// otherwise leave keys on the instance that no record claims (and the next plan would
// leave them alone as somebody else's); with the intent saved first, the next plan
// removes what the plan no longer names.
func (k *Container) saveIntent(env *agent.Env, det *containerDetail) error {
	if env == nil || env.State == nil {
		return nil
	}
	var rec containerRecord
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	if !rec.of(k.name, det.uuid) || det.create || det.replace {
		// Claims on another instance (or on the one about to be replaced) do not carry
		// over: a new instance carries only what this apply sets.
		rec = containerRecord{Image: rec.Image, Fingerprint: rec.Fingerprint, Retiring: rec.Retiring, RetiringUUID: rec.RetiringUUID, RetiringMember: rec.RetiringMember}
	}
	rec.Instance, rec.UUID, rec.Base = k.name, det.uuid, k.planName()
	if det.create || det.replace {
		rec.UUID = "" // the new instance's is not known before it exists
	}
	rec.Config = union(rec.Config, containerKeys(k.config))
	rec.Devices = union(rec.Devices, containerKeys(k.devices))
	return env.State.Save(rec)
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}

// start starts the instance; a failure names the host's GPUs when the plan asks for some.
func (k *Container) start(ctx context.Context, c *incus.Client) error {
	if err := c.Start(ctx, k.name); err != nil {
		return k.withHostGPUs(ctx, err, k.devices)
	}
	return nil
}

// stop stops the instance cleanly within the stop timeout, then kills it, and verifies
// that it stopped.
func (k *Container) stop(ctx context.Context, c *incus.Client, env *agent.Env) error {
	st, err := c.InstanceState(ctx, k.name)
	if err != nil {
		return err
	}
	if st.StatusCode == incus.StatusStopped {
		return nil
	}
	if err := c.Stop(ctx, k.name, k.stopTimeout); err != nil {
		if env != nil && env.Log != nil {
			env.Log.Warn("clean stop failed; killing", "instance", k.name, "stop_timeout", k.stopTimeout, "error", err)
		}
		if kerr := c.Kill(ctx, k.name); kerr != nil {
			return fmt.Errorf("stop instance %s: %w; then kill: %w", k.name, err, kerr)
		}
	}
	st, err = c.InstanceState(ctx, k.name)
	if err != nil {
		return err
	}
	if st.StatusCode != incus.StatusStopped {
		return fmt.Errorf("instance %s is %s after stop and kill", k.name, st.Status)
	}
	return nil
}

// withHostGPUs adds the GPUs this host has to an error when devs include a GPU.
func (k *Container) withHostGPUs(ctx context.Context, err error, devs map[string]map[string]string) error {
	for _, dev := range devs {
		if dev["type"] == "gpu" {
			return fmt.Errorf("%w; %s", err, k.hostGPUs(ctx))
		}
	}
	return err
}

// hostGPUs describes the GPUs this host has, for the error of a gpu device that names
// one it does not: DRM cards by PCI address, and what the NVIDIA driver sees.
func (k *Container) hostGPUs(ctx context.Context) string {
	root := k.host.Root
	if root == "" {
		root = "/"
	}
	var found []string
	seen := map[string]bool{}
	entries, _ := filepath.Glob(filepath.Join(root, "dev/dri/by-path/pci-*-card"))
	for _, e := range entries {
		base := filepath.Base(e)
		addr := gpu.NormalizePCIBusID(strings.TrimSuffix(strings.TrimPrefix(base, "pci-"), "-card"))
		card := ""
		if target, err := filepath.EvalSymlinks(e); err == nil {
			card = " " + filepath.Base(target)
		}
		seen[addr] = true
		found = append(found, fmt.Sprintf("pci %s (DRM%s)", addr, card))
	}
	nvidia := ""
	if k.host.GPU != nil {
		info, err := k.host.GPU.Observe(ctx)
		switch {
		case err != nil:
			nvidia = "NVIDIA driver: " + err.Error()
		case info.State != gpu.StateOK:
			nvidia = "NVIDIA driver: " + info.State.Message()
		default:
			for _, g := range info.GPUs {
				addr := gpu.NormalizePCIBusID(g.PCIBusID)
				desc := fmt.Sprintf("pci %s (%s, nvidia-smi index %d)", addr, g.Name, g.Index)
				if seen[addr] {
					for i, f := range found {
						if strings.HasPrefix(f, "pci "+addr+" ") {
							found[i] = desc
						}
					}
					continue
				}
				found = append(found, desc)
			}
		}
	}
	msg := "GPUs on this host: "
	if len(found) == 0 {
		msg += "none found (no /dev/dri/by-path/pci-*-card entries)"
	} else {
		msg += strings.Join(found, ", ")
	}
	if nvidia != "" {
		msg += "; " + nvidia
	}
	return msg
}

// userspaceScript prints the NVIDIA userspace driver version inside the instance: the
// target of libnvidia-ml.so.1 (libnvidia-ml.so.580.95.05), or what nvidia-smi says. It
// prints nothing when there is no driver.
const userspaceScript = `for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu /lib64 /usr/local/nvidia/lib64; do
  if [ -e "$d/libnvidia-ml.so.1" ] || [ -L "$d/libnvidia-ml.so.1" ]; then
    t=$(readlink -f "$d/libnvidia-ml.so.1" 2>/dev/null || readlink "$d/libnvidia-ml.so.1")
    echo "lib ${t##*/}"
    exit 0
  fi
done
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "smi $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
fi
exit 0
`

// userspaceVersion reads the NVIDIA userspace driver version inside the running
// instance; "" when it has none.
func (k *Container) userspaceVersion(ctx context.Context, c *incus.Client) (string, error) {
	res, err := c.Exec(ctx, k.name, incus.ExecRequest{Command: []string{"/bin/sh", "-c", userspaceScript}})
	if err != nil {
		return "", fmt.Errorf("read the NVIDIA userspace driver version inside %s: %w", k.name, err)
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("read the NVIDIA userspace driver version inside %s: exit code %d: %s", k.name, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return parseUserspace(string(res.Stdout)), nil
}

// parseUserspace reads the script's answer: "lib libnvidia-ml.so.580.95.05" or
// "smi 580.95.05".
func parseUserspace(out string) string {
	out = strings.TrimSpace(out)
	switch {
	case strings.HasPrefix(out, "lib "):
		v := strings.TrimPrefix(out, "lib ")
		if rest, ok := strings.CutPrefix(v, "libnvidia-ml.so."); ok && isDriverVersion(rest) {
			return rest
		}
		return ""
	case strings.HasPrefix(out, "smi "):
		v := strings.TrimSpace(strings.TrimPrefix(out, "smi "))
		if isDriverVersion(v) {
			return v
		}
	}
	return ""
}

func (k *Container) userspaceFix(have string) string {
	what := fmt.Sprintf("the NVIDIA userspace driver inside %s is %s", k.name, have)
	if have == "" {
		what = fmt.Sprintf("instance %s has no NVIDIA userspace driver (no libnvidia-ml.so.1)", k.name)
	}
	return fmt.Sprintf("%s, and the plan wants %s to match the host's kernel module (a mismatch fails with \"Driver/library version mismatch\"). Add an nvidia_installer { url, sha256 } block (the agent then runs it inside with --no-kernel-module), run NVIDIA-Linux-x86_64-%s.run --no-kernel-module --silent inside yourself, or set nvidia_runtime = true to mount the host's libraries",
		what, k.userspace, k.userspace)
}

// verifyUserspace checks the userspace driver once a new instance runs, and installs it
// when an installer is declared.
func (k *Container) verifyUserspace(ctx context.Context, c *incus.Client, env *agent.Env) error {
	if k.userspace == "" || !k.running {
		return nil
	}
	have, err := k.userspaceVersion(ctx, c)
	if err != nil {
		return err
	}
	if have == k.userspace {
		return nil
	}
	if k.installer != nil {
		return k.installUserspace(ctx, c, env)
	}
	return errors.New(k.userspaceFix(have))
}

// Status reports the instance's live state: status, init PID, addresses, attached GPUs
// and disks.
func (k *Container) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	if k.absent {
		return k.absentStatus(ctx, env)
	}
	k, rec, err := k.liveView(env)
	if err != nil {
		return nil, err
	}
	c := k.client(env)
	inst, _, err := c.GetInstance(ctx, k.name)
	if incus.IsNotFound(err) {
		return &agent.Status{Healthy: false, Summary: "instance " + k.name + " does not exist"}, nil
	}
	if member, oerr := offlineMember(ctx, c, k.name, err); oerr != nil {
		return &agent.Status{Summary: oerr.Error(), Fields: []agent.Field{agent.TextField("status", "status", "unknown"), agent.TextField(agent.MemberField, "member", member)}}, nil
	}
	if err != nil {
		return nil, reachErr(c, err)
	}
	st := &agent.Status{Fields: []agent.Field{agent.TextField("status", "status", inst.Status)}}
	if member := instanceMember(inst); member != "" {
		st.Fields = append(st.Fields, agent.TextField(agent.MemberField, "member", member))
		if err := memberOnline(ctx, c, member, k.name); err != nil {
			st.Fields[0] = agent.TextField("status", "status", "unknown") // the cluster's database answers for an offline member
			st.Summary = err.Error()
			return st, nil
		}
	}
	var addrs []string
	if inst.StatusCode == incus.StatusRunning {
		state, err := c.InstanceState(ctx, k.name)
		if err != nil {
			return nil, err
		}
		st.Fields = append(st.Fields, agent.NumberField("init_pid", "init_pid", state.Pid))
		if !state.StartedAt.IsZero() && state.StartedAt.Year() > 1970 {
			st.Fields = append(st.Fields, agent.TimeField("started_at", "started", state.StartedAt))
		}
		for _, ifname := range containerKeys(state.Network) {
			if ifname == "lo" {
				continue
			}
			for _, a := range state.Network[ifname].Addresses {
				if a.Scope == "global" {
					addrs = append(addrs, ifname+" "+a.Address)
				}
			}
		}
		if len(addrs) > 0 {
			st.Fields = append(st.Fields, agent.TextField("addresses", "addresses", strings.Join(addrs, ", ")))
		}
	}
	var gpus, disks []string
	for _, name := range containerKeys(inst.ExpandedDevices) {
		dev := inst.ExpandedDevices[name]
		switch dev["type"] {
		case "gpu":
			sel := renderIncusDevice(dev)
			gpus = append(gpus, name+" "+sel)
		case "disk":
			if dev["path"] == "/" {
				continue
			}
			src := dev["source"]
			if dev["pool"] != "" {
				src = dev["pool"] + "/" + src
			}
			ro := ""
			if dev["readonly"] == "true" {
				ro = " (ro)"
			}
			disks = append(disks, fmt.Sprintf("%s %s → %s%s", name, src, dev["path"], ro))
		}
	}
	if len(gpus) > 0 {
		st.Fields = append(st.Fields, agent.TextField("gpus", "gpus", strings.Join(gpus, "; ")))
	}
	if len(disks) > 0 {
		st.Fields = append(st.Fields, agent.TextField("disks", "disks", strings.Join(disks, "; ")))
	}
	if k.base != "" {
		st.Fields = append(st.Fields, agent.TextField("instance", "instance", k.name))
	}
	if rec.Retiring != "" {
		st.Fields = append(st.Fields, agent.TextField("retiring", "retiring", fmt.Sprintf("%s on %s (a migration: deleted once its dependents verify)", rec.Retiring, noneIfEmpty(rec.RetiringMember))))
	}
	if v := inst.ExpandedConfig["nvidia.runtime"]; v == "true" {
		st.Fields = append(st.Fields, agent.BoolField("nvidia_runtime", "nvidia_runtime", true))
	}
	if k.userspace != "" && inst.StatusCode == incus.StatusRunning {
		if have, err := k.userspaceVersion(ctx, c); err == nil {
			st.Fields = append(st.Fields, agent.TextField("nvidia_userspace", "nvidia_userspace", have).WithText(noneIfEmpty(have)))
		}
	}
	d, err := k.Check(ctx, env)
	switch {
	case err != nil:
		st.Summary = fmt.Sprintf("%s; %v", strings.ToLower(inst.Status), err)
	case d.Action != agent.NoOp:
		st.Summary = fmt.Sprintf("%s; differs from the plan (%s)", strings.ToLower(inst.Status), d.Action)
	default:
		st.Healthy = true
		st.Summary = strings.ToLower(inst.Status) + ", matches the plan"
	}
	return st, nil
}

func noneIfEmpty(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// renderIncusDevice renders a device's options (without its type) for a diff: {pci = "…"}.
func renderIncusDevice(dev map[string]string) string {
	var parts []string
	for _, key := range containerKeys(dev) {
		if key == "type" && dev["type"] != "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s = %q", key, dev[key]))
	}
	typ := dev["type"]
	if len(parts) == 0 {
		return typ + " {}"
	}
	return typ + " {" + strings.Join(parts, ", ") + "}"
}

// incusDevice is a device's options as a diff value: JSON shows the options as an object,
// people see renderIncusDevice's one line.
type incusDevice map[string]string

func (d incusDevice) String() string { return renderIncusDevice(d) }

func shortFP(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

func containerKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
