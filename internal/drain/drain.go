// Package drain is the record of `agent drain`: a host whose servers an operator stopped
// for hardware work stays drained (its servers held, never relaunched by agent run or
// apply) until `agent drain --undo`. The record lives in the state directory, so that it
// outlives the agent and a reboot.
package drain

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// File is the record's name in the state directory.
const File = "drained.json"

// Record says why and since when the host is drained.
type Record struct {
	Reason string    `json:"reason"`
	Since  time.Time `json:"since"`
	By     string    `json:"by"`
	// Group is the host group whose permit the drain holds ("" without coordination).
	Group string `json:"group,omitempty"`
}

// Read returns the state directory's drain record, nil when the host is not drained.
func Read(stateDir string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, File))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("drain record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("drain record %s: %w (agent drain --undo removes it)", filepath.Join(stateDir, File), err)
	}
	return &r, nil
}

// Write records the drain (0600, atomically).
func Write(stateDir string, r Record) error {
	b, _ := json.Marshal(r)
	if err := atomicfile.WriteFile(filepath.Join(stateDir, File), b, 0o600); err != nil {
		return fmt.Errorf("drain record: %w", err)
	}
	return nil
}

// Remove ends the drain's record.
func Remove(stateDir string) error {
	if err := atomicfile.Remove(filepath.Join(stateDir, File)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("drain record: %w", err)
	}
	return nil
}

// ErrDrained is wrapped by Hold's error for a server of a drained host.
var ErrDrained = errors.New("host drained")

// Hold is the engine's Hold of a drained host: every server is held (not observed for
// a change, never launched) while stateDir has a drain record.
func Hold(stateDir string) func(addr string) error {
	return func(addr string) error {
		if !strings.HasPrefix(addr, "server.") {
			return nil
		}
		r, err := Read(stateDir)
		if err != nil || r == nil {
			return err
		}
		why := ""
		if r.Reason != "" {
			why = " (" + r.Reason + ")"
		}
		return fmt.Errorf("%s: %w by %s since %s%s: agent drain --undo relaunches it", addr, ErrDrained, r.By, r.Since.UTC().Format(time.RFC3339), why)
	}
}
