package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// List returns the addresses that have a record, sorted: everything this agent manages
// on the host. A resource whose address is not in the plan is an orphan (agent/orphans.go).
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "resources"))
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	var out []string
	for _, e := range ents {
		addr, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !e.Type().IsRegular() || !addrRE.MatchString(addr) {
			continue
		}
		out = append(out, addr)
	}
	sort.Strings(out)
	return out, nil
}

// Has reports whether addr has a record.
func (s *Store) Has(addr string) (bool, error) {
	p, err := s.path(addr)
	if err != nil {
		return false, err
	}
	_, err = os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// ErrMoveTargetExists is returned by Move when the new address already has a record: two
// records would then describe one thing (two records naming one PID).
var ErrMoveTargetExists = errors.New("the new address already has a record")

// Move renames the record of from to to, atomically (one rename in one directory, then
// the directory is synced): a `moved` block. The record's content (a server's PID,
// generation and log paths) is kept as it is.
func (s *Store) Move(from, to string) error {
	pf, err := s.path(from)
	if err != nil {
		return err
	}
	pt, err := s.path(to)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(pt); err == nil {
		return fmt.Errorf("move %s to %s: %w", from, to, ErrMoveTargetExists)
	}
	if err := os.Rename(pf, pt); err != nil {
		return fmt.Errorf("move %s to %s: %w", from, to, err)
	}
	return atomicfile.SyncDir(filepath.Dir(pt))
}

// depsFile records, per address, what it depended on when it was last applied, so that
// orphans (whose blocks are gone) are deleted dependents first.
const depsFile = "deps.json"

// LoadDeps reads the recorded dependencies; none is an empty map.
func (s *Store) LoadDeps() (map[string][]string, error) {
	m := map[string][]string{}
	data, err := readTrusted(filepath.Join(s.dir, depsFile))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", depsFile, err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		// Only an order hint: a corrupt file costs the order among orphans, nothing else.
		return map[string][]string{}, nil
	}
	return m, nil
}

// SaveDeps writes the recorded dependencies atomically.
func (s *Store) SaveDeps(m map[string][]string) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(s.dir, depsFile), append(data, '\n'), 0o600)
}

// Addr is the address the record belongs to.
func (r *Scoped) Addr() string { return r.addr }

// View is the read-only face of a whole store that one resource gets to learn what the
// others recorded: a few named questions across kinds (resources/peers.go: a container's
// live instance for the servers in it, who else records a process) ask through it, and
// it has no way to write. Everything else a resource reads is its own record (Scoped).
type View struct {
	store *Store
	self  string
}

// Others is the view of every record but r's own (nil for a nil r: a step with no
// state, whose EachRecord then knows nothing).
func (r *Scoped) Others() *View {
	if r == nil {
		return nil
	}
	return &View{store: r.store, self: r.addr}
}

// List returns the addresses of kind ("server", "container") with a record, sorted, but
// the viewer's own.
func (v *View) List(kind string) ([]string, error) {
	all, err := v.store.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range all {
		if a != v.self && strings.HasPrefix(a, kind+".") {
			out = append(out, a)
		}
	}
	return out, nil
}

// Load reads the record of addr into x; false when there is none.
func (v *View) Load(addr string, x any) (bool, error) { return v.store.Load(addr, x) }

// EachRecord calls fn with every record of kind in v, decoded as T, until fn returns
// false: the cross-kind questions (resources/peers.go) read the others' records through
// it. A record that cannot be read is passed over. It reports false when the records
// could not be listed (or v is nil): the caller then does not know, and must choose the
// safe answer itself.
func EachRecord[T any](v *View, kind string, fn func(addr string, rec T) bool) bool {
	if v == nil {
		return false
	}
	addrs, err := v.List(kind)
	if err != nil {
		return false
	}
	for _, addr := range addrs {
		var rec T
		if ok, err := v.Load(addr, &rec); err != nil || !ok {
			continue
		}
		if !fn(addr, rec) {
			break
		}
	}
	return true
}

// View is the read-only view of every record of the store (agent drain's stop of the
// servers, outside any resource).
func (s *Store) View() *View { return &View{store: s} }
