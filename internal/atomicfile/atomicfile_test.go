package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for i, content := range []string{"first", "second, longer than the first", "3"} {
		if err := WriteFile(path, []byte(content), 0o640); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read %d = %q, %v; want %q", i, got, err, content)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o640 {
		t.Errorf("mode = %v, want 0640", st.Mode().Perm())
	}
	// No temporary file is left behind.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want 1: %v", len(entries), entries)
	}
}

func TestWriteDefaultModeIsPrivate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "secret")
	if err := Write(path, []byte("x"), Options{UID: -1, GID: -1}); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", st.Mode().Perm())
	}
}

func TestWriteFailureLeavesOldContent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A target that is a directory makes the rename fail after the data was written.
	if err := WriteFile(dir, []byte("new"), 0o644); err == nil {
		t.Fatal("writing over a directory succeeded")
	}
	got, _ := os.ReadFile(path)
	if string(got) != "old" {
		t.Errorf("content = %q, want old", got)
	}
	// The temporary file was created beside the target, in dir's parent, and removed.
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".tmp*"))
	if len(leftovers) != 0 {
		t.Errorf("a temporary file was left behind: %v", leftovers)
	}
}

func TestRemove(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "f")
	if err := Remove(path); err != nil {
		t.Fatalf("removing a missing file: %v", err)
	}
	os.WriteFile(path, []byte("x"), 0o644)
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("file still there: %v", err)
	}
}
