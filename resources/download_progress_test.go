package resources

import (
	"bytes"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/state"
)

var ansi = regexp.MustCompile(`\x1b\[[0-9]*[A-Za-z]`)

// On a terminal: one bar per active file plus a total, redrawn in place, erased at the
// end with a one-line summary; without a terminal nothing is drawn, only the record.
func TestDownloadProgressBars(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(filepath.Join(t.TempDir(), "state"))
	var term bytes.Buffer
	env := &agent.Env{Addr: "download.qwen", State: store.For("download.qwen"), Terminal: &term}
	r := newProgressReporter(env, "download.qwen", &downloadRecord{})
	snap := fetch.Progress{Done: 3 << 30, Total: 8 << 30, Rate: 300 << 20, ETA: 17 * time.Second, Files: []fetch.FileProgress{
		{Name: "model-00001-of-00002.safetensors", State: fetch.FileDownloading, Done: 2 << 30, Total: 4 << 30, Rate: 150 << 20, ETA: 14 * time.Second},
		{Name: "model-00002-of-00002.safetensors", State: fetch.FileDownloading, Done: 1 << 30, Total: 4 << 30, Rate: 150 << 20, ETA: 20 * time.Second},
		{Name: "config.json", State: fetch.FileDone, Done: 1 << 10, Total: 1 << 10},
	}}
	r.update(snap)
	first := ansi.ReplaceAllString(term.String(), "")
	for _, want := range []string{
		"model-00001-of-00002.safetensors         [============            ]   2.0 GiB / 4.0 GiB   150.0 MiB/s  ETA 14s",
		"model-00002-of-00002.safetensors         [======                  ]   1.0 GiB / 4.0 GiB   150.0 MiB/s  ETA 20s",
		"download.qwen                              [=========               ]   3.0 GiB / 8.0 GiB   300.0 MiB/s  ETA 17s",
	} {
		if !strings.Contains(first, want) {
			t.Errorf("bars lack %q:\n%s", want, first)
		}
	}
	if strings.Contains(first, "config.json") {
		t.Errorf("a finished file has a bar:\n%s", first)
	}
	term.Reset()
	r.update(snap) // redrawn in place: the cursor goes up over the 3 lines first
	if !strings.HasPrefix(term.String(), "\x1b[3A") {
		t.Errorf("redraw does not move up over the previous bars: %q", term.String()[:min(12, term.Len())])
	}
	term.Reset()
	r.update(fetch.Progress{Final: true, Done: 8 << 30, Total: 8 << 30})
	if out := ansi.ReplaceAllString(term.String(), ""); !strings.Contains(out, "download.qwen: 8.0 GiB in place") {
		t.Errorf("final line = %q", out)
	}

	// No terminal (not a tty, or --json): nothing drawn, progress still recorded for status.
	quiet := &agent.Env{Addr: "download.q2", State: store.For("download.q2")}
	rec := &downloadRecord{}
	newProgressReporter(quiet, "download.q2", rec).update(snap)
	if rec.Progress == nil || rec.Progress.Done != 3<<30 || len(rec.Progress.Files) != 2 {
		t.Errorf("progress record = %+v", rec.Progress)
	}
}
