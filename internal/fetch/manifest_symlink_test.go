package fetch

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// A dest that is a symlink to the real weights directory lists the files there, not the
// link itself as an extra file.
func TestExtrasThroughSymlinkedDest(t *testing.T) {
	t.Parallel()
	real := t.TempDir()
	os.WriteFile(filepath.Join(real, "model.safetensors"), []byte("w"), 0o644)
	os.WriteFile(filepath.Join(real, "notes.txt"), []byte("n"), 0o644)
	link := filepath.Join(t.TempDir(), "weights")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	got, err := extras(context.Background(), link, map[string]bool{"model.safetensors": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "notes.txt" {
		t.Errorf("extras = %q, want [notes.txt]", got)
	}
}
