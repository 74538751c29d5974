package resources

import (
	"os"

	"github.com/agent-dev/agent/agent"
)

// Kinds and KindsFor are resources/registry's, for the tests of the kinds still in this
// package (the registry imports this package, so these tests cannot import it).
func Kinds() []agent.Kind { return KindsFor(HostFromEnv(os.Getenv)) }

func KindsFor(h Machine) []agent.Kind {
	h = h.WithDefaults()
	if h.StopGPUServers == nil {
		h.StopGPUServers = ServerStopper(h.Proc, h.GPU)
	}
	if h.Containers == nil {
		h.Containers = ContainerPeers{}
	}
	if h.Servers == nil {
		h.Servers = ServerPeers{}
	}
	return []agent.Kind{ContainerKind(h), ServerKind(h)}
}
