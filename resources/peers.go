package resources

import (
	"github.com/agent-dev/agent/agent"
)

// The questions one kind asks of what another recorded, in one place and read-only: a
// kind reads its own record through env.State, and another's only through these, over
// the store's read-only view (state.View). Each question is a small interface that the
// kind owning the record implements and resources/registry hands to the kind that asks
// (through Machine), so that no kind imports another. A record that cannot be read is
// passed over, and where the records cannot be listed at all the caller gets the answer
// that keeps the host safe (state.EachRecord).
//
//   - Containers.LiveInstance (server asks container): the instance a server must run in
//     now.
//   - Servers.RunIn (container asks server): whether a migration would interrupt a server.
//   - GPUServerStopper (driver asks server, through Machine.StopGPUServers): the servers to
//     stop before a driver change (host.go).

// Containers is what the container kind answers about the instances it manages.
type Containers interface {
	// LiveInstance is, for a server in the instance the plan names name, the instance it
	// must run in now and the one retiring from a migration ("" when none), from the
	// record of the container block that manages name. Without one, name itself.
	LiveInstance(env *agent.Env, name string) (live, retiring string)
}

// Servers is what the server kind answers about the servers it launched.
type Servers interface {
	// RunIn reports whether a server the agent launched (and has not stopped for good)
	// runs in the instance, by the servers' records: what a migration must not
	// interrupt. Unknown (no records to read) is true: make before break, the safe way.
	RunIn(env *agent.Env, instance string) bool
}

// LiveInstance asks h.Containers; without one (a kind built alone, in a test), name.
func (h Machine) LiveInstance(env *agent.Env, name string) (live, retiring string) {
	if h.Containers == nil {
		return name, ""
	}
	return h.Containers.LiveInstance(env, name)
}

// ServersIn asks h.Servers; without one, true: the safe answer.
func (h Machine) ServersIn(env *agent.Env, instance string) bool {
	return h.Servers == nil || h.Servers.RunIn(env, instance)
}
