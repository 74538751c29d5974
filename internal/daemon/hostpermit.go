package daemon

import (
	"context"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
)

// finishHost ends, at the agent's start, the host disruption this host recorded (a driver
// upgrade and its reboot): in another boot than the one it rebooted from, once every
// resource of the plan is verified (the driver loaded at its version, each server ready,
// settled and smoke-tested by the loop's own passes), the host permit is released. It
// asks again every interval until then; a drain (agent drain --undo ends it), a reboot not
// yet happened, or no permit at all end it at once.
func (d *Daemon) finishHost(ctx context.Context, c *coord.Client, group string) {
	boot := ""
	if d.cfg.BootID != nil {
		boot = d.cfg.BootID()
	}
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		released, pending, err := fleet.FinishHost(rctx, c, group, boot, func(context.Context, coord.HostPermit) error { return d.verified() })
		cancel()
		switch {
		case released:
			d.log.Info("host disruption over: driver and servers verified, host permit released", "group", group, "boot_id", boot)
			return
		case err == nil:
			if pending != nil {
				d.log.Info("host permit kept", "permit", pending.String(), "why", "a drain (agent drain --undo ends it) or a reboot still to come")
			}
			return
		}
		d.log.Debug("host permit not released yet", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.resync()):
		}
	}
}

// verified reports, from the loop's last steps, whether every resource of the plan is
// converged and healthy; else which are not.
func (d *Daemon) verified() error {
	rep, _ := d.report()
	return fleet.Verified(rep)
}
