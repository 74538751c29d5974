package fleet

import (
	"log/slog"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/plans"
)

// Open connects to the fleet's etcd as the plan's coordination block says (nil when the
// plan has none: nothing of etcd is touched then). readOnly opens without a lease, for a
// view.
func Open(c *plans.Coordination, log *slog.Logger, readOnly bool) (*coord.Client, error) {
	if c == nil {
		return nil, nil
	}
	return coord.Open(coord.Config{Endpoints: c.Etcd, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Prefix: c.Prefix, Lease: c.Lease, Host: c.Name, Log: log, ReadOnly: readOnly})
}

// Leave ends this agent's part in the fleet: the lease is revoked (its entry and
// permits go at once) unless a member is still down or in flight, whose permit must
// keep counting until the lease expires.
func Leave(c *coord.Client, p *Permits) {
	held := false
	if p != nil {
		held = p.Held()
		p.Close()
	}
	if held {
		c.Abandon()
		return
	}
	c.Close()
}
