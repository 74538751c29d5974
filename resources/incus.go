package resources

import (
	"sync"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/plans"
)

// Incus is a kind's way to the plan's Incus daemon, taken at bind: the socket the plan's
// agent block names (agent { incus_socket }; "" is INCUS_SOCKET, else the first socket
// found), and one client per socket path, shared by the resource's runs and its views.
type Incus struct {
	explicit string
	clients  *sync.Map // socket path → *incus.Client
}

// NewIncus is the Incus of a plan's agent block (nil: a plan without one, or an orphan
// of no plan).
func NewIncus(a *plans.AgentSettings) Incus {
	i := Incus{clients: new(sync.Map)}
	if a != nil {
		i.explicit = a.IncusSocket
	}
	return i
}

// Client is the client of the socket, found at each call (a default socket may appear
// after bind, as incusd starts). A zero Incus (a resource built by hand, in a test)
// caches nothing.
func (i Incus) Client() *incus.Client {
	sock := incus.SocketPath(i.explicit)
	if i.clients == nil {
		return incus.New(sock)
	}
	if c, ok := i.clients.Load(sock); ok {
		return c.(*incus.Client)
	}
	c, _ := i.clients.LoadOrStore(sock, incus.New(sock))
	return c.(*incus.Client)
}
