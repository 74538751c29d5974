package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/daemon"
	"github.com/agent-dev/agent/internal/state"
)

// acquireLock takes the state lock for a command that acts (plan, apply, destroy). A
// running `agent run` holds that lock for its whole life (it reconciles continuously, so
// a manual apply would be undone by its next reconcile, or would race it): the command
// is then refused at once, naming the daemon and what to do, whatever --lock-timeout
// says. Another command's lock is waited for up to timeout, as before.
func acquireLock(ctx context.Context, store *state.Store, timeout time.Duration, cmd, plan string) (*state.Lock, error) {
	lock, err := store.Acquire(ctx, 0, "agent "+cmd+" "+plan)
	if err == nil {
		return lock, nil
	}
	if refused := daemonRefusal(cmd, plan, err); refused != nil {
		return nil, refused
	}
	if timeout <= 0 {
		return nil, err
	}
	lock, err = store.Acquire(ctx, timeout, "agent "+cmd+" "+plan)
	if refused := daemonRefusal(cmd, plan, err); refused != nil {
		return nil, refused
	}
	return lock, err
}

// ErrDaemonHolds is wrapped by the refusal of a command while `agent run` holds the host.
var ErrDaemonHolds = errors.New("agent run manages this host")

// daemonRefusal turns a lock held by `agent run` into the refusal that says what to do;
// nil for any other error.
func daemonRefusal(cmd, plan string, err error) error {
	var le *state.LockedError
	if !errors.As(err, &le) || !strings.HasPrefix(le.Holder.Command, daemon.DaemonCommand+" ") {
		return nil
	}
	who := fmt.Sprintf("%q (PID %d, since %s)", le.Holder.Command, le.Holder.PID, le.Holder.Since.Local().Format(time.RFC3339))
	what := "it would undo a manual change at its next reconcile"
	if cmd == "plan" {
		what = "it observes and repairs continuously"
	}
	return fmt.Errorf("%w: %s holds the state dir %s, and %s. To change the host, edit the plan it runs: it reloads at once (or run systemctl reload agent). "+
		"`agent status %s` shows what it observes. To %s by hand, stop it first (systemctl stop agent)",
		ErrDaemonHolds, who, filepath.Dir(le.Path), what, plan, cmd)
}
