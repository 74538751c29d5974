package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-dev/agent/internal/trust"
)

// Holder says who holds the lock; it is written into the lock file so that a waiting
// agent can name it.
type Holder struct {
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
	Command string    `json:"command"`
}

// LockedError is returned when another agent holds the lock past the lock timeout.
type LockedError struct {
	Path   string
	Holder Holder // zero when the holder did not say
}

func (e *LockedError) Error() string {
	who := "another agent"
	if e.Holder.PID != 0 {
		who = fmt.Sprintf("PID %d since %s", e.Holder.PID, e.Holder.Since.Local().Format(time.RFC3339))
		if e.Holder.Command != "" {
			who += " (" + e.Holder.Command + ")"
		}
	}
	return fmt.Sprintf("state dir %s is locked by %s; wait for it, or retry with --lock-timeout 5m", filepath.Dir(e.Path), who)
}

// Lock is a held lock on a state directory. It is an flock(2) on <dir>/lock, so the kernel
// releases it when the holder dies however it dies: a lock left by a dead process is simply
// taken by the next agent, with no manual clean-up.
type Lock struct {
	f *os.File
}

// Acquire takes the lock of the state directory, waiting up to timeout (0: try once).
// command describes this agent ("agent apply plan.hcl") for whoever waits on it.
func (s *Store) Acquire(ctx context.Context, timeout time.Duration, command string) (*Lock, error) {
	path := filepath.Join(s.dir, "lock")
	// O_CLOEXEC (Go's default) matters: processes the agent launches must not inherit
	// the lock, or a long-lived server would hold it forever.
	// trust.OpenFile: O_NOFOLLOW, and a regular file of ours with one link, because
	// the holder is written into it: a planted symlink or hard link must never make the
	// agent truncate another file.
	f, err := trust.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !time.Now().Before(deadline) {
			holder := readHolder(path)
			f.Close()
			return nil, &LockedError{Path: path, Holder: holder}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(min(100*time.Millisecond, time.Until(deadline)+time.Millisecond)):
		}
	}
	h := Holder{PID: os.Getpid(), Since: time.Now().UTC().Truncate(time.Second), Command: command}
	data, _ := json.Marshal(h)
	// Rewritten in place (not renamed: the flock is on this inode).
	if err := f.Truncate(0); err == nil {
		f.WriteAt(append(data, '\n'), 0)
		f.Sync()
	}
	return &Lock{f: f}, nil
}

// Release gives the lock up. Releasing twice is harmless.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	l.f.Truncate(0)
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}

func readHolder(path string) Holder {
	var h Holder
	f, err := trust.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return h
	}
	data, err := io.ReadAll(io.LimitReader(f, 4096))
	f.Close()
	if err != nil {
		return h
	}
	json.Unmarshal([]byte(strings.TrimSpace(string(data))), &h)
	return h
}
