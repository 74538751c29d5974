package fleet

import (
	"log/slog"
	"path/filepath"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/plans"
)

// Open connects to the fleet's etcd as the plan's coordination block says (nil when the
// plan has none: nothing of etcd is touched then). stateDir keeps the lease's ID, so
// that an agent started again within the lease keeps it; "" opens without a lease, for a
// view.
func Open(c *plans.Coordination, log *slog.Logger, stateDir string) (*coord.Client, error) {
	if c == nil {
		return nil, nil
	}
	cfg := configOf(c, log)
	cfg.ReadOnly = stateDir == ""
	if stateDir != "" {
		cfg.LeaseFile = filepath.Join(stateDir, LeaseFile)
	}
	return coord.Open(cfg)
}

// LeaseFile is the file in the state directory that keeps the agent's etcd lease ID.
const LeaseFile = "coordination-lease"

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

// configOf is the client's configuration of the plan's coordination block.
func configOf(c *plans.Coordination, log *slog.Logger) coord.Config {
	return coord.Config{Endpoints: c.Etcd, CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile,
		Prefix: c.Prefix, Lease: c.Lease, Host: c.Name, Log: log}
}
