// Package registry is every resource kind built into the agent, in one list: what the
// plan loader and agent.Bind take. It is the one package that imports the kinds; each
// kind imports only resources, the API the kinds share, so that no kind imports another.
package registry

import (
	"os"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/download"
	"github.com/agent-dev/agent/resources/driver"
	"github.com/agent-dev/agent/resources/file"
)

// Kinds returns every resource kind built into the agent, acting on this host.
func Kinds() []agent.Kind { return KindsFor(resources.HostFromEnv(os.Getenv)) }

// KindsFor returns every resource kind, acting on h. What h leaves unset is the real
// thing: the GPUs of h.Root, and the server kind as the one that stops the servers
// holding the GPUs before a driver change.
func KindsFor(h resources.Machine) []agent.Kind {
	h = h.WithDefaults()
	if h.StopGPUServers == nil {
		h.StopGPUServers = resources.ServerStopper(h.Proc, h.GPU)
	}
	if h.Containers == nil {
		h.Containers = resources.ContainerPeers{}
	}
	if h.Servers == nil {
		h.Servers = resources.ServerPeers{}
	}
	return []agent.Kind{
		file.FileKind(),
		driver.DriverKind(h),
		resources.ContainerKind(h),
		download.DownloadKind(h),
		resources.ServerKind(h),
	}
}
