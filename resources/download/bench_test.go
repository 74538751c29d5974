package download

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-dev/agent/agent"
)

// BenchmarkHubConfirmed is the cost of confirming a converged Hub download of 500 files
// from its manifest, as every plan and every reconcile pass does: no request to the Hub
// (the revision is pinned to a commit), no file re-read (size and mtime match the
// manifest). Target: under 50 ms an observation.
//
//	go test -run '^$' -bench HubConfirmed ./resources
func BenchmarkHubConfirmed(b *testing.B) {
	dir := b.TempDir()
	files := make([]hubTestFile, 500)
	for i := range files {
		files[i] = hubTestFile{path: fmt.Sprintf("shard-%03d/model-%05d.json", i/50, i), data: randBytes(256, uint64(i)+1)}
	}
	h := newFakeHub(b, files)
	h.pageSize = 1000
	tokenFile := filepath.Join(dir, "hf-token")
	if err := os.WriteFile(tokenFile, []byte(h.token+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	mustApply(b, engine(b, dir, hubPlan(h, tokenFile, h.commit)))
	got, _ := filepath.Glob(filepath.Join(dir, "models", "m", "shard-*", "*.json"))
	if len(got) != len(files) {
		b.Fatalf("apply left %d files, want %d", len(got), len(files))
	}
	e := engine(b, dir, hubPlan(h, tokenFile, h.commit))
	before := h.requests.Load()
	b.ResetTimer()
	for b.Loop() {
		if st := planStep(b, e, "download.model"); st.Diff.Action != agent.NoOp {
			b.Fatalf("converged download planned %s", st.Diff.Action)
		}
	}
	b.StopTimer()
	if n := h.requests.Load() - before; n != 0 {
		b.Fatalf("confirming a pinned download made %d Hub requests, want none", n)
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/confirm")
}
