package download

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/state"
)

// The download kind reports progress as data: each snapshot of fetch goes to whoever
// listens (Env.OnProgress; the views draw it, internal/view), with the files in flight
// only, and is kept in the state record for `agent status` in another process; nobody
// listening (--json) changes only that nothing is drawn.
func TestDownloadProgressReported(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(filepath.Join(t.TempDir(), "state"))
	var got []agent.Progress
	env := &agent.Env{Addr: "download.qwen", State: store.For("download.qwen"), OnProgress: func(p agent.Progress) { got = append(got, p) }}
	rec := &downloadRecord{}
	r := newProgressReporter(env, rec)
	snap := fetch.Progress{Done: 3 << 30, Total: 8 << 30, Rate: 300 << 20, ETA: 17 * time.Second, Files: []fetch.FileProgress{
		{Name: "model-00001-of-00002.safetensors", State: fetch.FileDownloading, Done: 2 << 30, Total: 4 << 30, Rate: 150 << 20, ETA: 14 * time.Second},
		{Name: "model-00002-of-00002.safetensors", State: fetch.FileVerifying, Done: 1 << 30, Total: 4 << 30, Rate: 150 << 20, ETA: 20 * time.Second},
		{Name: "config.json", State: fetch.FileDone, Done: 1 << 10, Total: 1 << 10},
	}}
	r.update(snap)
	if len(got) != 1 {
		t.Fatalf("reported %d snapshots, want 1", len(got))
	}
	p := got[0]
	if p.Addr != "download.qwen" || p.Done != 3<<30 || p.Total != 8<<30 || p.Rate != 300<<20 || p.ETA != 17*time.Second || p.Final {
		t.Errorf("reported %+v", p)
	}
	if len(p.Files) != 2 || p.Files[0].Name != "model-00001-of-00002.safetensors" || p.Files[0].Verifying ||
		!p.Files[1].Verifying || p.Files[1].Done != 1<<30 {
		t.Errorf("files in flight %+v, want the two model files (the second verifying), not config.json", p.Files)
	}
	if rec.Progress == nil || rec.Progress.Done != 3<<30 || len(rec.Progress.Files) != 2 || rec.Progress.Files[1].State != "verifying" {
		t.Errorf("progress record = %+v", rec.Progress)
	}
	r.update(fetch.Progress{Final: true, Done: 8 << 30, Total: 8 << 30})
	if last := got[len(got)-1]; !last.Final || last.Done != 8<<30 || last.Elapsed <= 0 {
		t.Errorf("final report %+v", last)
	}
	n := len(got)
	r.end() // the final snapshot came: nothing more to close
	if len(got) != n {
		t.Errorf("end after the final snapshot reported again: %+v", got[n:])
	}

	// fetch ended without its final snapshot: end closes what the views drew.
	r2 := newProgressReporter(env, &downloadRecord{})
	r2.update(snap)
	r2.end()
	if last := got[len(got)-1]; !last.Final {
		t.Errorf("end did not report the end: %+v", last)
	}

	// Nobody listens: progress is still recorded for status.
	quiet := &agent.Env{Addr: "download.q2", State: store.For("download.q2")}
	rec2 := &downloadRecord{}
	newProgressReporter(quiet, rec2).update(snap)
	if rec2.Progress == nil || rec2.Progress.Done != 3<<30 {
		t.Errorf("progress record = %+v", rec2.Progress)
	}
}
