package fetch_test

import (
	"testing"

	"github.com/agent-dev/agent/internal/fetch"
)

// BenchmarkFetch64MiB downloads one 64 MiB file over loopback: transfer, streaming sha256,
// checkpoints every 64 MiB (the default), fsync and rename.
func BenchmarkFetch64MiB(b *testing.B) {
	s := serve(&testing.T{})
	defer s.Close()
	data := content(64<<20, 7)
	f := add(s, "model.bin", data)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		dest := b.TempDir()
		if _, err := fetch.Fetch(b.Context(), []fetch.File{f}, fetch.Options{Dest: dest}); err != nil {
			b.Fatal(err)
		}
	}
}
