package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// rolloutsFile records the members of rollout groups whose disruption (a restart,
// replace or delete) started and was not yet verified: after a SIGKILL, the next apply
// counts them as unavailable and finishes them before disrupting another member.
const rolloutsFile = "rollouts.json"

// RolloutMember is one member of a rollout group in flight.
type RolloutMember struct {
	Group  string    `json:"group"`
	Action string    `json:"action"`
	Since  time.Time `json:"since"`
	// Failed is the error of its last try, when it failed: the group's rollout stops
	// until the member is repaired and verified.
	Failed string `json:"failed,omitempty"`
	// Member is the cluster member it lives on, when known (for the failure's report).
	Member string `json:"member,omitempty"`
}

// LoadRollouts reads the rollout members in flight, by address; none is an empty map.
// Unlike the dependency order, a corrupt file is an error: it is what keeps a resumed
// rollout within max_unavailable.
func (s *Store) LoadRollouts() (map[string]RolloutMember, error) {
	m := map[string]RolloutMember{}
	p := filepath.Join(s.dir, rolloutsFile)
	if err := readMap(p, &m, "it lists the rollout members in flight; check that no server of a rollout group is down, then move it aside and re-run"); err != nil {
		return nil, err
	}
	for addr := range m {
		if !addrRE.MatchString(addr) {
			return nil, fmt.Errorf("%s is corrupt: %q is not a resource address (move it aside and re-run)", p, addr)
		}
	}
	return m, nil
}

// SaveRollouts writes the rollout members in flight atomically (an empty map removes
// the file).
func (s *Store) SaveRollouts(m map[string]RolloutMember) error {
	return saveMap(filepath.Join(s.dir, rolloutsFile), m, len(m))
}

// readMap reads a map file of the state directory into m, leaving it alone when there
// is none; a corrupt one is an error that says what the file is for (why).
func readMap(p string, m any, why string) error {
	data, err := readTrusted(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if err := json.Unmarshal(data, m); err != nil {
		return fmt.Errorf("%s is corrupt: %w (%s)", p, err, why)
	}
	return nil
}

// saveMap writes a map file of the state directory atomically; n == 0 removes it.
func saveMap(p string, m any, n int) error {
	if n == 0 {
		return atomicfile.Remove(p)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(p, append(data, '\n'), 0o600)
}
