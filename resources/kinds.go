// Package resources is what the resource kinds share: the Machine they act on, the
// binder helpers, the paths a plan may name, and the read-only questions one kind asks
// of another's records (peers.go). Each kind is its own package under resources/
// (resources/server, resources/container, …), and resources/registry lists them all.
package resources

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
)

// Machine is what resource kinds need from the machine they act on (not to be mistaken
// for a plan's host block, or for lifecycle.Local, the place a server runs in when it
// runs on the host). Everything is passed in, never taken from globals, so tests replace
// any part: a mock GPU, a fake /proc root.
type Machine struct {
	// GPU observes NVIDIA GPUs; nil means gpu.Default(Root).
	GPU gpu.Observer
	// Proc reads processes; the zero value reads /proc.
	Proc proc.FS
	// Root is the host's filesystem root for fallbacks ("" is "/").
	Root string
	// Run runs host commands (the driver installer, the package manager, nvidia-smi,
	// modprobe, systemctl reboot); nil runs them for real (ExecRunner).
	Run CommandRunner
	// StopGPUServers stops the agent's servers that use the GPUs before a driver change
	// (the server resource implements it); nil: a driver change refuses to run while
	// processes use the GPUs, and names them.
	StopGPUServers GPUServerStopper
	// HostDisruption takes the fleet's host permit before a driver replace and records
	// the reboot in it (agent { coordination }); nil: nothing is asked.
	HostDisruption HostDisruption
	// Containers and Servers answer one kind's questions of another's records
	// (peers.go); resources/registry sets them to the container and server kinds.
	Containers Containers
	Servers    Servers
	// IncusRemote makes servers in containers run as on another cluster member: their
	// processes observed, stopped and watched inside through the Incus API only, their
	// logs read through its file API (lifecycle.Incus.Remote). Tests set it: the test
	// cluster's members share one host, where the runner would otherwise use /proc.
	IncusRemote bool
	// StateDir is where kinds keep caches and logs (the driver's installer and its log);
	// "" means the plan's agent.state_dir, else /var/lib/agent.
	StateDir string
	// AgentStart names this agent process (resources.ProcessStart; "" is computed): a
	// reboot the driver asked for in this boot from another agent process (one killed
	// between its record and systemctl reboot) is asked for again, once per agent start.
	AgentStart string
}

// WithDefaults is h with the real GPUs of h.Root where h names none.
func (h Machine) WithDefaults() Machine {
	if h.GPU == nil {
		h.GPU = gpu.Default(h.Root)
	}
	return h
}

// Path is rel under the host's root.
func (h Machine) Path(rel string) string {
	root := h.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, filepath.FromSlash(rel))
}

// BootID is this boot's id (/proc/sys/kernel/random/boot_id under the root); "" when not
// readable. A reboot changes it: the driver's reboot once per boot and a host permit's
// release after the reboot go by it.
func (h Machine) BootID() string {
	b, err := os.ReadFile(h.Path("proc/sys/kernel/random/boot_id"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
