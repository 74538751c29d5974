package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/coord"
)

// WaitWhileHeld makes the gate's Begin wait, up to limit, while the host group has no
// permit free for this host (agent apply: an operator's command waits its turn where
// agent run's loop waits between passes), asking again every HostAskEvery; the wait is
// told to ctx's WithHostWait. 0 returns a refusal at once again.
func (g *HostGate) WaitWhileHeld(limit time.Duration) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.wait = limit
}

// HostAskEvery is how often a waiting gate asks for the host permit again.
const HostAskEvery = time.Second

// hostLeaseWait bounds a waiting gate's wait for its own lease (a command's lease is
// granted a moment after it connects); etcd that does not answer is not waited out.
const hostLeaseWait = 10 * time.Second

type hostWaitKey struct{}

// WithHostWait is ctx with say, which a gate waiting for the host permit under it tells
// where the wait stands ("waiting for a host permit in group gpu-hosts: held by kpro6
// (driver 570.172.08 → 580.95.05, rebooting since 10:04)"): at the first refusal, when
// the holders change, every 30 s, and once the permit is taken.
func WithHostWait(ctx context.Context, say func(string)) context.Context {
	return context.WithValue(ctx, hostWaitKey{}, say)
}

// awaitHost takes this host's permit for req, waiting while it is refused (the group's
// permits held elsewhere, a rollout group with members down elsewhere, a new epoch's
// fence) for at most limit, or until ctx ends.
func awaitHost(ctx context.Context, c *coord.Client, req coord.HostRequest, limit time.Duration) error {
	say, _ := ctx.Value(hostWaitKey{}).(func(string))
	if say == nil {
		say = func(string) {}
	}
	start := time.Now()
	var last, waited string
	var told time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.TakeHost(actx, req)
		cancel()
		var ref *coord.HostRefusal
		var epoch *coord.Epoch
		msg := ""
		switch {
		case err == nil:
			if waited != "" {
				say(fmt.Sprintf("host permit in group %s taken after %s", req.Group, time.Since(start).Round(time.Second)))
			}
			return nil
		case errors.As(err, &ref):
			msg = WaitingFor(ref)
		case errors.As(err, &epoch):
			msg = fmt.Sprintf("waiting for a host permit in group %s: %v", req.Group, epoch)
		case errors.Is(err, coord.ErrNoLease) && time.Since(start) < hostLeaseWait:
			if waited == "" {
				waited = "no live etcd lease yet"
			}
		default:
			return err
		}
		if msg != "" {
			waited = strings.TrimPrefix(msg, "waiting for a host permit in group "+req.Group+": ")
		}
		if time.Since(start) >= limit {
			return fmt.Errorf("no host permit in group %s after %s (%s): agent status --fleet shows the holders; "+
				"free a host that does not come back with agent fleet release HOST PLAN, then run agent apply again",
				req.Group, limit, waited)
		}
		if msg != "" && (msg != last || time.Since(told) >= 30*time.Second) {
			say(msg)
			last, told = msg, time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped waiting for a host permit in group %s (%s): %w", req.Group, waited, ctx.Err())
		case <-time.After(HostAskEvery):
		}
	}
}

// WaitingFor says what a refused host permit waits for, the holders named with what
// disrupts them: "waiting for a host permit in group gpu-hosts: held by kpro6 (driver
// 570.172.08 → 580.95.05, rebooting since 10:04)".
func WaitingFor(r *coord.HostRefusal) string {
	if r.Failed != nil { // the group stopped: the host, the step and the error quoted
		return fmt.Sprintf("waiting for a host permit in group %s: %v", r.Group, r)
	}
	if r.Rollout != "" || r.Stop != nil {
		return fmt.Sprintf("waiting for a host permit in group %s: %s", r.Group, strings.TrimPrefix(r.Error(), "host disruption: "))
	}
	var hs []string
	for _, h := range r.Holders {
		what := h.Cause
		if h.Detail != "" {
			what = h.Detail
		}
		hs = append(hs, fmt.Sprintf("%s (%s, %s since %s)", h.Host, what, h.State, h.Since.Local().Format("15:04")))
	}
	return fmt.Sprintf("waiting for a host permit in group %s: held by %s", r.Group, strings.Join(hs, "; "))
}
