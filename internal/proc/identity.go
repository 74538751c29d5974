package proc

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Identity names one process across PID reuse: the PID together with its
// start time in clock ticks since boot. The server resource records it at
// launch; every later check and every signal goes through it.
type Identity struct {
	PID        int
	StartTicks uint64
}

func (id Identity) String() string { return fmt.Sprintf("pid %d (start %d)", id.PID, id.StartTicks) }

// Identify returns the identity of the process now at pid.
func (fs FS) Identify(pid int) (Identity, error) {
	s, err := fs.Stat(pid)
	if err != nil {
		return Identity{}, err
	}
	return s.Identity(), nil
}

// Alive reports whether the process id names is still running as that
// identity: its stat exists, its start time is the recorded one, and it is
// not a zombie. A missing entry, another start time (the PID was reused) or
// a zombie all mean gone. An error means the answer is unknown, never gone.
func (fs FS) Alive(id Identity) (bool, error) {
	s, err := fs.Stat(id.PID)
	if errors.Is(err, ErrNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return s.StartTicks == id.StartTicks && !s.Dead(), nil
}

// Signal sends sig to id only if it is still alive as that identity. It
// opens a pidfd first and checks the identity after, so the signal reaches
// the very process that was checked: if the PID were reused between the
// check and the send, the pidfd would still name the old, exited process
// and the kernel would answer ESRCH. It reports whether the signal was sent.
// Where pidfds are unavailable (old kernel, seccomp) it falls back to
// check-then-kill, whose window is a PID wrap-around within microseconds.
// Like Stop, it refuses a root that is not this process's own procfs.
func (fs FS) Signal(id Identity, sig syscall.Signal) (bool, error) {
	if err := fs.checkRoot(); err != nil {
		return false, err
	}
	pidfd, err := unix.PidfdOpen(id.PID, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return false, nil
	case err != nil:
		pidfd = -1 // fall back to kill(2)
	default:
		defer unix.Close(pidfd)
	}
	alive, err := fs.Alive(id)
	if err != nil || !alive {
		return false, err
	}
	if pidfd >= 0 {
		err = unix.PidfdSendSignal(pidfd, sig, nil, 0)
	} else {
		err = syscall.Kill(id.PID, sig)
	}
	if errors.Is(err, syscall.ESRCH) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("signal %s to %v: %w", sig, id, err)
	}
	return true, nil
}
