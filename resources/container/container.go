// Package container is the `container` resource kind: an Incus instance, on a cluster
// member when the plan says so, migrated make-before-break. It implements
// resources.Containers.
package container

import (
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
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

	host  resources.Machine
	incus resources.Incus // the plan's Incus socket and its clients, shared by its views (liveView)
	base  string          // the plan's instance name, when name is its migration pair (container_migrate.go)

	resources.Deletion // ensure = "absent", agent destroy, an orphan: container_delete.go
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
func ContainerKind(h resources.Machine) agent.Kind {
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
	k.Orphan = func(addr string, st *state.Scoped, a *plans.AgentSettings) (agent.Resource, error) {
		return orphanContainer(h, addr, st, a)
	}
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

// Record is the container's state record: what the last apply created and set,
// so that a key or device that leaves the plan is removed and an alias that moves to a
// newer image does not force a replace.
//
// The record is of one instance: its name and volatile.uuid. A record of another instance
// (the plan's name changed, or the instance was deleted and made again by someone else)
// claims nothing on the one observed, so the keys and devices found there are left alone.
type Record struct {
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
func (r Record) leftover() string {
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
func (r Record) of(name, uuid string) bool {
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
	return k.incus.Client()
}

// Timeout gives a container that installs the NVIDIA userspace driver the driver's own
// step budget: the download, the push and the installer run in one step, and a step cut
// short leaves the installer running inside while the next pass would start another.
// Other containers keep the engine's default.
func (k *Container) Timeout() time.Duration {
	if k.installer != nil {
		return resources.DriverTimeout
	}
	return 0
}

func noneIfEmpty(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
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
