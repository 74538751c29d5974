package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// destroyedFile records, per address, when `agent destroy` last removed it (verified).
// A resource with no record of its own that is listed here was destroyed, not never
// applied: status says "absent" instead of "missing".
const destroyedFile = "destroyed.json"

// LoadDestroyed reads the addresses agent destroy removed, with when; none is an empty
// map. Like the dependency order it is a hint for status: a corrupt file counts as none.
func (s *Store) LoadDestroyed() (map[string]time.Time, error) {
	m := map[string]time.Time{}
	data, err := readTrusted(filepath.Join(s.dir, destroyedFile))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", destroyedFile, err)
	}
	if json.Unmarshal(data, &m) != nil {
		return map[string]time.Time{}, nil
	}
	return m, nil
}

// SaveDestroyed writes them atomically (an empty map removes the file).
func (s *Store) SaveDestroyed(m map[string]time.Time) error {
	return saveMap(filepath.Join(s.dir, destroyedFile), m, len(m))
}
