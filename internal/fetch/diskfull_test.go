package fetch_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/testbin"
	"golang.org/x/sys/unix"
)

// TestDiskFull fills a small tmpfs: the Fetch fails cleanly with ErrDiskFull, nothing is put
// in place, and the partial file keeps a valid checkpoint that a Fetch elsewhere resumes from.
// It needs permission to mount tmpfs (root) and is skipped otherwise.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	small := t.TempDir()
	if err := unix.Mount("tmpfs", small, "tmpfs", 0, "size=512k"); err != nil {
		testbin.Missing(t, "cannot mount a small tmpfs: "+err.Error(), "run as root")
	}
	t.Cleanup(func() { unix.Unmount(small, unix.MNT_DETACH) })
	s := serve(t)
	data := content(1<<20, 100)
	f := add(s, "model.bin", data)
	opts := testOptions(small)
	opts.FreeSpaceMargin = -1 // get past the up-front check to hit the real write error
	_, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
	if !errors.Is(err, fetch.ErrDiskFull) {
		t.Fatalf("Fetch: %v, want ErrDiskFull", err)
	}
	t.Logf("error: %v", err)
	wantAbsent(t, small, "model.bin")
	if n := s.Stats("/model.bin").GETs; n != 1 {
		t.Errorf("%d GETs, want 1 (a full disk is not retried)", n)
	}

	// The checkpoint is sound: move partial and sidecar to roomy disk and resume there.
	var sc struct{ Offset int64 }
	b, err := os.ReadFile(filepath.Join(small, ".model.bin.partial.json"))
	if err != nil || json.Unmarshal(b, &sc) != nil || sc.Offset == 0 {
		t.Fatalf("sidecar: %v %s", err, b)
	}
	roomy := t.TempDir()
	for _, n := range []string{".model.bin.partial", ".model.bin.partial.json"} {
		b, err := os.ReadFile(filepath.Join(small, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(roomy, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(roomy))
	if err != nil {
		t.Fatalf("Fetch on roomy disk: %v", err)
	}
	wantFile(t, roomy, "model.bin", data)
	if res.Files[0].ResumedFrom != sc.Offset {
		t.Errorf("resumed from %d, want the checkpoint %d", res.Files[0].ResumedFrom, sc.Offset)
	}
}
