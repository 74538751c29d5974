package view

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
)

var ansi = regexp.MustCompile(`\x1b\[[0-9]*[A-Za-z]`)

// snapshot is a download of two model files in flight (the third is done, so the kind
// does not report it).
var snapshot = agent.Progress{Addr: "download.qwen", Done: 3 << 30, Total: 8 << 30, Rate: 300 << 20, ETA: 17 * time.Second, Files: []agent.FileProgress{
	{Name: "model-00001-of-00002.safetensors", Done: 2 << 30, Total: 4 << 30, Rate: 150 << 20, ETA: 14 * time.Second},
	{Name: "model-00002-of-00002.safetensors", Done: 1 << 30, Total: 4 << 30, Rate: 150 << 20, ETA: 20 * time.Second},
}}

// On a terminal: one bar per file in flight plus a total, redrawn in place, erased at
// the end with a one-line summary; without a terminal nothing is drawn.
func TestWorkProgressBars(t *testing.T) {
	t.Parallel()
	var out, term bytes.Buffer
	v := &View{W: &out, Term: &term}
	v.WorkProgress(snapshot)
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
	term.Reset()
	v.WorkProgress(snapshot) // redrawn in place: the cursor goes up over the 3 lines first
	if !strings.HasPrefix(term.String(), "\x1b[3A") {
		t.Errorf("redraw does not move up over the previous bars: %q", term.String()[:min(12, term.Len())])
	}
	term.Reset()
	v.WorkProgress(agent.Progress{Addr: "download.qwen", Final: true, Done: 8 << 30, Total: 8 << 30, Elapsed: 32 * time.Second})
	if got := term.String(); !strings.HasPrefix(got, "\x1b[3A\r\x1b[J") || strings.TrimPrefix(ansi.ReplaceAllString(got, ""), "\r") != "  download.qwen: 8.0 GiB in place (32s, 256.0 MiB/s)\n" {
		t.Errorf("final = %q, want the bars erased and one line", got)
	}
	if out.Len() != 0 {
		t.Errorf("bars went to the report's writer: %q", out.String())
	}

	// No terminal (not a tty): nothing drawn.
	var quiet bytes.Buffer
	q := &View{W: &quiet}
	q.WorkProgress(snapshot)
	q.WorkProgress(agent.Progress{Addr: "download.qwen", Final: true, Done: 8 << 30})
	if quiet.Len() != 0 {
		t.Errorf("drew without a terminal: %q", quiet.String())
	}
}

// A verifying file says so; more than 8 files in flight are summed up in one line.
func TestWorkProgressManyFiles(t *testing.T) {
	t.Parallel()
	var term bytes.Buffer
	v := &View{W: &bytes.Buffer{}, Term: &term}
	p := agent.Progress{Addr: "download.big", Done: 10, Total: -1, ETA: -1}
	for i := range 10 {
		p.Files = append(p.Files, agent.FileProgress{Name: strings.Repeat("x", 50) + string(rune('a'+i)), Verifying: i == 0, Done: 1, Total: -1, ETA: -1})
	}
	v.WorkProgress(p)
	got := ansi.ReplaceAllString(term.String(), "")
	for _, want := range []string{"…" + strings.Repeat("x", 38) + "a", "? verifying", "… and 2 more files", "[????????????????????????]", "/ ?", "ETA ?"} {
		if !strings.Contains(got, want) {
			t.Errorf("bars lack %q:\n%s", want, got)
		}
	}
}
