package gpu

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rogpeppe/go-internal/txtar"
)

// rootFS extracts testdata/rootfs/<name>.txtar into a temporary directory
// and returns it, to be used as a ProcFS root. The trees live in txtar
// archives because real names such as gpus/0000:01:00.0 contain colons,
// which Go module zips and some checkouts do not allow.
func rootFS(t *testing.T, name string) string {
	t.Helper()
	ar, err := txtar.ParseFile(filepath.Join("testdata", "rootfs", name+".txtar"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, f := range ar.Files {
		p := filepath.Join(dir, filepath.FromSlash(f.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// script is a fake Observer that answers from a list, repeating the last
// answer, and counts its calls.
type script struct {
	mu      sync.Mutex
	answers []Info
	calls   int
}

func (s *script) Observe(ctx context.Context) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	i := min(s.calls, len(s.answers)-1)
	s.calls++
	return s.answers[i], nil
}

func (s *script) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func ptr[T any](v T) *T { return &v }
