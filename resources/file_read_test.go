package resources

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadNoFollow(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("grown since the lstat"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, size := range []int64{0, 5, 21, 4096} { // the Lstat's size may be stale
		if got, err := readNoFollow(p, size); err != nil || string(got) != "grown since the lstat" {
			t.Errorf("size %d: %q, %v", size, got, err)
		}
	}
	// A symlink swapped in after the Lstat is refused, never followed.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(p, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readNoFollow(link, 21); !errors.Is(err, syscall.ELOOP) || !strings.Contains(err.Error(), link) {
		t.Errorf("symlink: %v, want ELOOP naming %s", err, link)
	}
}
