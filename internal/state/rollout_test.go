package state

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/trust"
)

// TestRolloutsRecord: the members in flight round-trip, an empty set removes the file,
// and a file that is corrupt, names no resource, or that others could have written is
// refused (it decides how many servers may be stopped at once).
func TestRolloutsRecord(t *testing.T) {
	needRoot(t)
	t.Parallel()
	base := t.TempDir()
	s, err := Open(filepath.Join(base, "state"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(s.Dir(), rolloutsFile)
	if m, err := s.LoadRollouts(); err != nil || len(m) != 0 {
		t.Fatalf("no file: %v, %v", m, err)
	}
	since := time.Date(2026, 12, 2, 20, 0, 0, 0, time.UTC)
	want := map[string]RolloutMember{"server.qwen_b": {Group: "qwen", Action: "restart", Since: since, Failed: "launch failed", Member: "kpro6"}}
	if err := s.SaveRollouts(want); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("saved file: %v, %v", st, err)
	}
	got, err := s.LoadRollouts()
	if err != nil || len(got) != 1 || got["server.qwen_b"] != want["server.qwen_b"] {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if err := s.SaveRollouts(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("an empty set left the file: %v", err)
	}

	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"corrupt", `{"server.a": `, 0o600, "is corrupt"},
		{"not an address", `{"../../etc": {"group": "g"}}`, 0o600, "is not a resource address"},
		{"others could write it", `{}`, 0o666, "chmod go-w " + p},
	} {
		os.Remove(p)
		os.WriteFile(p, []byte(tc.content), tc.mode)
		os.Chmod(p, tc.mode)
		if m, err := s.LoadRollouts(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, %v; want an error with %q", tc.name, m, err, tc.want)
		}
	}
	os.Remove(p)
	os.Symlink(filepath.Join(base, "elsewhere.json"), p)
	os.WriteFile(filepath.Join(base, "elsewhere.json"), []byte(`{}`), 0o600)
	if _, err := s.LoadRollouts(); !errors.Is(err, trust.ErrUntrusted) {
		t.Errorf("through a symlink: %v", err)
	}
}
