// Package registry is every resource kind built into the agent, in one list: what the
// plan loader and agent.Bind take. It is the one package that imports the kinds; each
// kind imports only resources, the API the kinds share, so that no kind imports another.
package registry

import (
	"os"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/container"
	"github.com/agent-dev/agent/resources/download"
	"github.com/agent-dev/agent/resources/driver"
	"github.com/agent-dev/agent/resources/file"
	"github.com/agent-dev/agent/resources/server"
)

// Kinds returns every resource kind built into the agent, acting on this host.
func Kinds() []agent.Kind { return KindsFor(resources.HostFromEnv(os.Getenv)) }

// KindsFor returns every resource kind, acting on h. What h leaves unset is the real
// thing: the GPUs of h.Root, the server kind as the one that stops the servers holding
// the GPUs before a driver change, and the container and server kinds as the ones that
// answer each other's questions (resources.Containers, resources.Servers).
func KindsFor(h resources.Machine) []agent.Kind {
	h = wire(h)
	return []agent.Kind{
		file.FileKind(),
		driver.DriverKind(h),
		container.ContainerKind(h),
		download.DownloadKind(h),
		server.ServerKind(h),
	}
}

// wire is h with what it leaves unset filled in.
func wire(h resources.Machine) resources.Machine {
	h = h.WithDefaults()
	if h.StopGPUServers == nil {
		h.StopGPUServers = server.ServerStopper(h.Proc, h.GPU)
	}
	if h.Containers == nil {
		h.Containers = container.ContainerPeers{}
	}
	if h.Servers == nil {
		h.Servers = server.ServerPeers{}
	}
	return h
}

// Machine is the host Kinds acts on, wired as its kinds have it: agent drain stops the
// servers through its StopGPUServers, the stopper a driver change uses.
func Machine() resources.Machine { return wire(resources.HostFromEnv(os.Getenv)) }
