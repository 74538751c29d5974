package daemon

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/view"
)

// finishHost ends, at the agent's start, the host disruption this host recorded (a driver
// upgrade and its reboot): in another boot than the one it rebooted from, once every
// resource of the plan is verified (the driver loaded at its version, each server ready,
// settled and smoke-tested by the loop's own passes), the host permit is released. It
// asks again whenever a step settles (at most once a second) and every interval; a
// drain (agent drain --undo ends it), a reboot not
// yet happened, or no permit at all end it at once.
func (d *Daemon) finishHost(ctx context.Context, c *coord.Client, group string) {
	boot := ""
	if d.cfg.BootID != nil {
		boot = d.cfg.BootID()
	}
	told := ""
	for {
		tried := time.Now()
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
		var vf *fleet.VerifyFailure
		if errors.As(err, &vf) && vf.Error() != told {
			// Once per distinct failure: the loop asks again every interval.
			told = vf.Error()
			d.log.Error("host disruption failed at verify: the host group is stopped fleet-wide until this host is verified or agent fleet release frees it",
				"group", group, "error", vf.Err)
		}
		d.log.Debug("host permit not released yet", "error", err)
		if !d.awaitSettled(ctx, tried) {
			return
		}
	}
}

// awaitSettled waits until a step of the loop settles (publish), but no sooner than a
// second after tried, or an interval at most: the host permit is released as soon as the
// last server serves (it waited up to a whole interval, 30 s by default, per host of a
// rolling upgrade), and etcd is asked at most once a second. false: ctx ended.
func (d *Daemon) awaitSettled(ctx context.Context, tried time.Time) bool {
	interval := time.NewTimer(d.resync())
	defer interval.Stop()
	var soon <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return false
		case <-interval.C:
			return true
		case <-soon:
			return true
		case <-d.published:
			if soon == nil {
				soon = time.After(time.Until(tried.Add(time.Second)))
			}
		}
	}
}

// verified reports, from the loop's last steps, whether every resource of the plan is
// converged and healthy; else which are not, as a *fleet.VerifyFailure when one of them
// failed (FinishHost records it: the host group stops fleet-wide).
func (d *Daemon) verified() error {
	rep, p := d.report()
	var secrets []string
	if p != nil {
		secrets = p.Secrets()
	}
	return hostVerdict(rep, view.NewRedactor(secrets))
}

// hostVerdict is verified's judgement of a report (fleet.Judge): beside the waits of
// any caller, a dependency on its way (a WaitingError) is not a failure, and a backoff
// is quoted by its last error, without its countdown, so that the same failure is
// recorded once; red redacts it.
func hostVerdict(rep *agent.Report, red *view.Redactor) error {
	return fleet.Judge(rep, red, func(err error) (string, bool) {
		var w *WaitingError
		if errors.As(err, &w) {
			return "", true
		}
		if _, last, ok := strings.Cut(err.Error(), "last error: "); ok && errors.Is(err, ErrBackoff) {
			return last, false
		}
		return "", false
	})
}
