package container

import (
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// bindContainer checks a container block beyond its types and returns the Container:
// the instance, its config (and the NVIDIA runtime and userspace driver), its devices.
func bindContainer(r *plans.Resource, c *ContainerConfig) (*Container, hcl.Diagnostics) {
	b := &resources.Binder{R: r}
	k := &Container{
		addr: r.Addr, name: r.Name, image: c.Image, itype: "container",
		profiles: []string{"default"}, config: map[string]string{}, secretConf: func(key string) bool { return r.SensitiveKey("config", key) },
		devices: map[string]map[string]string{}, deviceKind: map[string]string{},
		description: c.Description, target: resources.Deref(c.Target), userspace: resources.Deref(c.NvidiaUserspace),
		running: true, stopTimeout: 30 * time.Second, incus: resources.NewIncus(r.Agent),
	}
	k.bindInstance(b, c)
	k.bindConfig(b, c)
	k.bindDevices(b, c)
	return k, b.Diags
}

// bindInstance reads the instance: its name, image, type, profiles, replace policy,
// power and stop timeout.
func (k *Container) bindInstance(b *resources.Binder, c *ContainerConfig) {
	r, bad := b.R, b.Bad
	if c.Name != nil {
		k.name = *c.Name
	}
	if !resources.ValidInstanceName(k.name) {
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
	switch v := resources.Deref(c.Replace); v {
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
			b.BadValue(r.Range("stop_timeout"), "Invalid stop_timeout", fmt.Sprintf("%q is not a duration of at least 1s, such as \"30s\".", *c.StopTimeout))
		} else {
			k.stopTimeout = d
		}
	}
}

// bindConfig reads the config keys (never a key Incus owns), the NVIDIA runtime, and the
// userspace driver with its installer.
func (k *Container) bindConfig(b *resources.Binder, c *ContainerConfig) {
	r, bad := b.R, b.Bad
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
}

// bindDevices reads the gpu, disk and device blocks; their names are one namespace.
func (k *Container) bindDevices(b *resources.Binder, c *ContainerConfig) {
	r, bad := b.R, b.Bad
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
		if resources.Deref(d.ReadOnly) {
			dev["readonly"] = "true"
		}
		if resources.Deref(d.Shift) {
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
