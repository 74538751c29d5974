package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// Keeping a host serving (issue 25): when a change's new generation fails, the server
// kind launches its last verified generation's exact inputs again. Before it does, it
// asks whether those inputs can still run here: a revert that cannot start (the old
// virtualenv was removed, the old model directory deleted, something else took the
// port) would only add a second failure to the first, so it is said plainly instead.

// ErrCannotRelaunch is wrapped by every failed CanRelaunch.
var ErrCannotRelaunch = errors.New("cannot run again")

// CanRelaunch checks that s, a launch that once ran here, can start again with log as
// its log: what Preflight checks (the command exists and is executable, the working
// directory, the user, the log directory and the new log path), each of paths exists
// where the server runs (its model directory), and port is free (waiting up to wait for
// a port a stop just released). A path in an instance on another cluster member cannot
// be seen from here and is not checked: the launch's own verification is the proof there.
func (l *Lifecycle) CanRelaunch(ctx context.Context, s Spec, log LogFile, paths []string, port int, wait time.Duration) error {
	if err := l.Preflight(ctx, s, log); err != nil {
		return fmt.Errorf("%w: %w", ErrCannotRelaunch, err)
	}
	for _, p := range paths {
		if err := l.pathExists(ctx, p); err != nil {
			return fmt.Errorf("%w: %w", ErrCannotRelaunch, err)
		}
	}
	if port > 0 {
		if err := l.Place.Procs(ctx).PortFree(ctx, port, wait); err != nil {
			return fmt.Errorf("%w: %w", ErrCannotRelaunch, err)
		}
	}
	return nil
}

// pathExists says whether p exists in the place (nil when it cannot be seen from here).
func (l *Lifecycle) pathExists(ctx context.Context, p string) error {
	host := p
	if r, ok := l.Place.(*Incus); ok {
		if remote, err := r.remote(ctx); err != nil || remote {
			return nil
		}
		hp, err := r.HostPath(ctx, p)
		if err != nil {
			return nil
		}
		host = hp
	}
	if _, err := os.Stat(host); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s does not exist (in %s)", p, l.Place.Name())
		}
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}
