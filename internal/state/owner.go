package state

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// OwnerFile holds the state directory's identity: a random ID made once. Each launch
// carries it (AGENT_OWNER in the server's environment, with the directory), so that a
// process is owned by one state directory: another one never adopts it (issue 27: `agent
// plan --state-dir OTHER` recorded as its own a server the running daemon managed, and
// either could stop it).
const OwnerFile = "owner"

// OwnerEnv is the environment variable a launch carries its owner in: "ID:STATE_DIR".
const OwnerEnv = "AGENT_OWNER"

// Owner returns the state directory's identity, made on first use.
func (s *Store) Owner() (string, error) {
	if id, err := OwnerOf(s.dir); err == nil && id != "" {
		return id, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b)
	if err := atomicfile.WriteFile(filepath.Join(s.dir, OwnerFile), []byte(id+"\n"), 0o600); err != nil {
		return "", err
	}
	return id, nil
}

// OwnerMark is the OwnerEnv value of a launch from this state directory.
func (s *Store) OwnerMark() (string, error) {
	id, err := s.Owner()
	if err != nil {
		return "", err
	}
	return id + ":" + s.dir, nil
}

// OwnerOf reads the identity of the state directory dir.
func OwnerOf(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	return strings.TrimSpace(string(b)), err
}

// ParseOwnerMark splits an OwnerEnv value into its ID and state directory.
func ParseOwnerMark(v string) (id, dir string, ok bool) {
	return strings.Cut(v, ":")
}

// OwnerMark is the state directory's OwnerMark, for a launch of this resource.
func (r *Scoped) OwnerMark() (string, error) { return r.store.OwnerMark() }

// Owner is the state directory's identity.
func (r *Scoped) Owner() (string, error) { return r.store.Owner() }
