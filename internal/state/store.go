package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/agent-dev/agent/internal/atomicfile"
	"github.com/agent-dev/agent/internal/trust"
)

// DefaultDir is where state lives unless --state-dir or the plan's agent block says otherwise.
const DefaultDir = "/var/lib/agent"

// Store is a state directory.
type Store struct {
	dir string
}

// Open opens (creating it with mode 0700 when missing) the state directory dir.
// The directory and every one above it must pass internal/trust (owned by root or the
// agent's user, not writable by group or others): its records name processes the agent
// will signal, so a directory another user could write is refused with the fix, never
// tightened and then trusted. An existing directory merely readable by others is
// tightened to 0700: it holds PIDs, log paths and download manifests that are nobody
// else's business.
func Open(dir string) (*Store, error) {
	if dir == "" {
		dir = DefaultDir
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	if err := trust.Dir(abs); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", abs, err)
	}
	if err := os.MkdirAll(filepath.Join(abs, "resources"), 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w (choose another with --state-dir)", err)
	}
	for _, d := range []string{abs, filepath.Join(abs, "resources")} {
		st, err := os.Lstat(d)
		if err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
		if d != abs && st.Mode().Type()&os.ModeSymlink != 0 {
			return nil, fmt.Errorf("state dir: %w", &trust.Error{Path: d, Problem: "is a symlink, which the agent never follows there",
				Fix: "check where it points, then rm " + d + " (the agent recreates it)"})
		}
		if err := trust.Dir(d); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
		if st, err = os.Stat(d); err != nil {
			return nil, fmt.Errorf("state dir: %w", err)
		}
		if st.Mode().Perm() != 0o700 {
			if err := os.Chmod(d, 0o700); err != nil {
				return nil, fmt.Errorf("state dir %s has mode %v and cannot be tightened to 0700: %w", d, st.Mode().Perm(), err)
			}
		}
	}
	return &Store{dir: abs}, nil
}

// Dir is the absolute path of the state directory.
func (s *Store) Dir() string { return s.dir }

// maxRecord bounds what Load reads: a record is a few kilobytes.
const maxRecord = 16 << 20

// readTrusted reads a file of the state directory: never through a symlink, and only a
// file root (or the agent) wrote and nobody else can write (trust.OpenFile), since a
// record names processes the agent may signal.
func readTrusted(p string) ([]byte, error) {
	f, err := trust.OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxRecord))
}

var addrRE = regexp.MustCompile(`^[a-z][a-z0-9_]*\.[A-Za-z0-9_-]+$`)

func (s *Store) path(addr string) (string, error) {
	if !addrRE.MatchString(addr) {
		return "", fmt.Errorf("state: %q is not a resource address", addr)
	}
	return filepath.Join(s.dir, "resources", addr+".json"), nil
}

// Load reads the record of the resource at addr into v. It reports false, and leaves v
// alone, when there is no record.
func (s *Store) Load(addr string, v any) (bool, error) {
	p, err := s.path(addr)
	if err != nil {
		return false, err
	}
	data, err := readTrusted(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%s: read state: %w", addr, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("%s: state file %s is corrupt: %w (move it aside and re-run; the agent observes the host again)", addr, p, err)
	}
	return true, nil
}

// Save writes v as the record of the resource at addr, atomically, mode 0600.
func (s *Store) Save(addr string, v any) error {
	p, err := s.path(addr)
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("%s: encode state: %w", addr, err)
	}
	if err := atomicfile.WriteFile(p, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("%s: save state: %w", addr, err)
	}
	return nil
}

// Delete removes the record of the resource at addr; a missing record is not an error.
func (s *Store) Delete(addr string) error {
	p, err := s.path(addr)
	if err != nil {
		return err
	}
	if err := atomicfile.Remove(p); err != nil {
		return fmt.Errorf("%s: delete state: %w", addr, err)
	}
	return nil
}

// Scoped is the part of a Store that belongs to one resource: what a resource gets, so
// it can read and write only its own record.
type Scoped struct {
	store    *Store
	addr     string
	readOnly bool
}

// For returns the record of the resource at addr.
func (s *Store) For(addr string) *Scoped { return &Scoped{store: s, addr: addr} }

// ErrReadOnly is returned by a write through a read-only record: an observation (a
// kind's Check) returns its record updates as data, and the engine keeps them.
var ErrReadOnly = errors.New("state: this record is read-only here: an observation returns its record update in its diff (agent.Diff.Record), and the engine keeps it")

// ReadOnly is the same record, refusing every write: what an observation gets.
func (r *Scoped) ReadOnly() *Scoped { c := *r; c.readOnly = true; return &c }

// Load reads the resource's record into v; false when there is none.
func (r *Scoped) Load(v any) (bool, error) { return r.store.Load(r.addr, v) }

// Save writes the resource's record.
func (r *Scoped) Save(v any) error {
	if r.readOnly {
		return fmt.Errorf("%s: save: %w", r.addr, ErrReadOnly)
	}
	return r.store.Save(r.addr, v)
}

// Delete removes the resource's record.
func (r *Scoped) Delete() error {
	if r.readOnly {
		return fmt.Errorf("%s: delete: %w", r.addr, ErrReadOnly)
	}
	return r.store.Delete(r.addr)
}

// Dir is the state directory, for resources that keep caches or logs beside their record
// (the driver installer and its log).
func (r *Scoped) Dir() string { return r.store.dir }
