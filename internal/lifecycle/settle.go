package lifecycle

import (
	"context"
	"fmt"
	"time"
)

// settle watches a launch that just answered ready for o.Ready.Settle: it must stay
// alive all along and still be ready at the end. A server that crashes two seconds after
// its first 200 (a scheduler dying on its first batch, a late OOM) is a failed launch,
// not a verified one. It returns "" when the launch settled, else why not.
func (l *Lifecycle) settle(ctx context.Context, x *Launched, o LaunchOptions) string {
	if o.Ready.Settle <= 0 {
		return ""
	}
	end := time.NewTimer(o.Ready.Settle)
	defer end.Stop()
	tick := time.NewTicker(l.poll())
	defer tick.Stop()
	procs := l.ProcsIn(ctx, x.NS)
	died := func() string {
		return fmt.Sprintf("%s, %.1f s after it answered ready (ready.settle %s)", l.exitReason(x), time.Since(x.ReadyAt).Seconds(), o.Ready.Settle)
	}
	for {
		select {
		case <-x.Exited:
			return died()
		case <-ctx.Done():
			return "interrupted while it settled"
		case <-end.C:
			if alive, err := procs.Alive(ctx, x.ID); err == nil && !alive {
				return died()
			}
			if o.Ready.HTTP != "" {
				if err := l.probeHTTP(ctx, o.Port, o.Ready.HTTP, 5*time.Second); err != nil {
					return fmt.Sprintf("ready, then not ready at the end of ready.settle %s: %v", o.Ready.Settle, err)
				}
			}
			return ""
		case <-tick.C:
			if alive, err := procs.Alive(ctx, x.ID); err == nil && !alive {
				if x.Exited != nil {
					select { // our own child: let the reaper record how it ended
					case <-x.Exited:
					case <-time.After(time.Second):
					}
				}
				return died()
			}
		}
	}
}
