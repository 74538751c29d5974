package server

import (
	"os"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/container"
	"github.com/agent-dev/agent/resources/file"
	"github.com/agent-dev/agent/resources/restest"
)

// incusd is this test binary's private Incus daemon, started by the first test of a
// server in a container (the others never start it).
var incusd = incustest.NewShared()

// incusCluster is this test binary's private three-member Incus cluster, formed by the
// first test on a cluster member (see container/cluster_test.go for what its tests may do
// to it).
var incusCluster = incustest.NewSharedCluster()

func TestMain(m *testing.M) {
	restest.WaitingParallel(restest.WaitingTests)
	os.Exit(incusCluster.Done(incusd.Run(m)))
}

// kindsFor is the kinds a server test's plans declare: the server, the container it may
// run in, and the file that stays when a server leaves the plan; wired as resources/registry wires them (which this package's tests cannot
// import: it imports this package).
func kindsFor(h resources.Machine) []agent.Kind {
	h = h.WithDefaults()
	if h.StopGPUServers == nil {
		h.StopGPUServers = ServerStopper(h.Proc, h.GPU)
	}
	h.Containers, h.Servers = container.ContainerPeers{}, ServerPeers{}
	return []agent.Kind{file.FileKind(), container.ContainerKind(h), ServerKind(h)}
}

// kinds is kindsFor the host the tests run on.
func kinds() []agent.Kind { return kindsFor(resources.HostFromEnv(os.Getenv)) }
