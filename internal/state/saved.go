package state

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// Saved plans (agent plan -out, agent apply FILE) keep two things here: the key of their
// digests, so that a saved plan read elsewhere holds nothing a guess of a secret can be
// tested against, and the ids of the saved plans applied, so that none is applied twice.
const (
	planKeyFile      = "plan.key"
	appliedPlansFile = "applied-plans.json"
)

// PlanKey returns the state directory's key for the digests of saved plans, made (32
// random bytes, 0600) the first time.
func (s *Store) PlanKey() ([]byte, error) {
	p := filepath.Join(s.dir, planKeyFile)
	key, err := readTrusted(p)
	switch {
	case err == nil && len(key) == 32:
		return key, nil
	case err == nil:
		return nil, fmt.Errorf("%s is corrupt (%d bytes, want 32): remove it; plans saved before then must be made again", p, len(key))
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	// Written whole beside it, then linked into place: link fails when another agent's
	// key got there first, and that one is used (never two keys for one directory).
	tmp := p + ".new-" + fmt.Sprint(os.Getpid())
	if err := atomicfile.WriteFile(tmp, key, 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", tmp, err)
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, p); errors.Is(err, os.ErrExist) {
		return s.PlanKey()
	} else if err != nil {
		return nil, fmt.Errorf("write %s: %w", p, err)
	}
	if err := atomicfile.SyncDir(s.dir); err != nil {
		return nil, err
	}
	return key, nil
}

// AppliedPlan is what the state directory remembers of a saved plan applied.
type AppliedPlan struct {
	// File is where the saved plan was read from, for the refusal's message.
	File string    `json:"file"`
	At   time.Time `json:"at"`
	// Outcome is "started" until the apply ends, then "applied" or "failed".
	Outcome string `json:"outcome"`
}

var planIDRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// AppliedPlans reads the saved plans applied here, by id; none is an empty map. A
// corrupt file is an error: it is what keeps a saved plan from being applied twice.
func (s *Store) AppliedPlans() (map[string]AppliedPlan, error) {
	m := map[string]AppliedPlan{}
	err := readMap(filepath.Join(s.dir, appliedPlansFile), &m, "it lists the saved plans applied here; move it aside only if none of them may be applied again")
	return m, err
}

// RecordAppliedPlan records (atomically) that the saved plan id was applied, or is
// being applied: its outcome. Callers hold the state lock.
func (s *Store) RecordAppliedPlan(id string, a AppliedPlan) error {
	if !planIDRE.MatchString(id) {
		return fmt.Errorf("saved plan id %q is not 32 hex digits", id)
	}
	m, err := s.AppliedPlans()
	if err != nil {
		return err
	}
	m[id] = a
	return saveMap(filepath.Join(s.dir, appliedPlansFile), m, len(m))
}
