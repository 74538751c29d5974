package state

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/agent-dev/agent/internal/bytesize"
)

// MinFree is the room a directory the agent records into (the state directory, a
// server's log directory) must have before the agent breaks something it would then
// have to record: a few KiB of records, and a server's first log lines, with room to
// spare.
const MinFree = 16 << 20

// CheckRoom reports whether dir can take what the agent is about to record: it is
// writable (a probe file is created, written and removed) and its filesystem has at
// least spare bytes free for the agent. A full disk is refused with its figures, as an
// error that wraps syscall.ENOSPC: the host's fault, never the resource's (issue 27: a
// full state disk let a flag change stop a healthy server, then fail to record the next
// launch and launch nothing).
func CheckRoom(dir string, spare uint64) error {
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	if free := fs.Bavail * uint64(fs.Bsize); free < spare {
		return fmt.Errorf("%s has %s free, less than the %s the agent keeps to record a launch: free some space there (df -h %s): %w",
			dir, bytesize.Format(free), bytesize.Format(spare), dir, syscall.ENOSPC)
	}
	probe, err := os.CreateTemp(dir, ".agent-room-*")
	if err != nil {
		return fmt.Errorf("%s is not writable: %w", dir, err)
	}
	defer os.Remove(probe.Name())
	_, err = probe.Write(make([]byte, 4096))
	if cerr := probe.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s cannot take a record: %w", filepath.Clean(dir), err)
	}
	return nil
}

// CheckRoom is CheckRoom of the state directory.
func (r *Scoped) CheckRoom(spare uint64) error {
	if err := CheckRoom(r.store.dir, spare); err != nil {
		return fmt.Errorf("state dir %w", err)
	}
	return nil
}
