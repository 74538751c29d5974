// Package atomicfile writes files so that a reader, or the agent after a crash, sees either
// the old content or the new one, never half of it: a temporary file in the same
// directory, fsync, rename over the target, fsync the directory (as tailscale's atomicfile
// and google/renameio do). State, manifests, unit files and managed files all go through it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Options says how the new file is created.
type Options struct {
	// Mode is the permission of the new file (0600 when zero).
	Mode os.FileMode
	// UID and GID own the new file; -1 keeps the writer's. The zero value of Options
	// means root-owned only when the writer is root, so use Owned or set both.
	UID, GID int
}

// WriteFile writes data to path atomically with the given permission, owned by the writer.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Write(path, data, Options{Mode: perm, UID: -1, GID: -1})
}

// Write writes data to path atomically. The temporary file is created in path's directory
// so that the rename never crosses a filesystem; it is removed on any failure.
func Write(path string, data []byte, o Options) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	mode := o.Mode
	if mode == 0 {
		mode = 0o600
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if o.UID >= 0 || o.GID >= 0 {
		if err := tmp.Chown(o.UID, o.GID); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so that a rename or removal in it survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// Remove removes path and fsyncs its directory; a missing file is not an error.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}
