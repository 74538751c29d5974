package view

import (
	"bytes"
	"regexp"
	"slices"
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

	// No terminal (not a tty): no bars; short work says nothing more than its step.
	var quiet bytes.Buffer
	q := &View{W: &quiet}
	q.WorkProgress(snapshot)
	q.WorkProgress(agent.Progress{Addr: "download.qwen", Final: true, Done: 8 << 30, Elapsed: 2 * time.Second})
	if quiet.Len() != 0 {
		t.Errorf("short work printed without a terminal: %q", quiet.String())
	}
}

// Without a terminal (output to a file or the journal), long work prints where it stands
// every 30 s of its time, with bytes, rate and ETA, and no escape code; the clock is the
// work's own Elapsed, so this test runs 95 s of a download in no time. Two downloads at
// once each keep their own beat.
func TestWorkProgressLinesWithoutTerminal(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	v := &View{W: &out}
	const total = 8 << 30
	for el := time.Duration(0); el <= 95*time.Second; el += 250 * time.Millisecond {
		done := int64(el / time.Second * 64 << 20)
		v.WorkProgress(agent.Progress{Addr: "download.qwen", Done: done, Total: total, Rate: 64 << 20, ETA: time.Duration(total-done) / (64 << 20) * time.Second, Elapsed: el,
			Files: snapshot.Files})
		if el <= 40*time.Second {
			v.WorkProgress(agent.Progress{Addr: "download.small", Done: done / 2, Total: -1, Rate: 32 << 20, ETA: -1, Elapsed: el})
		}
	}
	v.WorkProgress(agent.Progress{Addr: "download.small", Final: true, Done: 1 << 30, Total: 1 << 30, Elapsed: 40 * time.Second})
	v.WorkProgress(agent.Progress{Addr: "download.qwen", Final: true, Done: total, Total: total, Elapsed: 128 * time.Second})
	want := "" +
		"  … download.qwen: 1.9 GiB of 8.0 GiB (23%), 64.0 MiB/s, ETA 1m38s\n" +
		"  … download.small: 960.0 MiB, 32.0 MiB/s, ETA unknown\n" +
		"  … download.qwen: 3.8 GiB of 8.0 GiB (46%), 64.0 MiB/s, ETA 1m8s\n" +
		"  … download.qwen: 5.6 GiB of 8.0 GiB (70%), 64.0 MiB/s, ETA 38s\n" +
		"  download.small: 1.0 GiB in place (40s, 25.6 MiB/s)\n" +
		"  download.qwen: 8.0 GiB in place (2m8s, 64.0 MiB/s)\n"
	if out.String() != want {
		t.Errorf("lines:\n%s\nwant:\n%s", out.String(), want)
	}
	if strings.Contains(out.String(), "\x1b") {
		t.Errorf("an escape code without a terminal: %q", out.String())
	}
}

// ProgressLines' interval is its own: a line each Every, none before the first.
func TestProgressLinesEvery(t *testing.T) {
	t.Parallel()
	l := &ProgressLines{Every: 10 * time.Second}
	var at []time.Duration
	for el := time.Duration(0); el < 35*time.Second; el += 3 * time.Second {
		if _, ok := l.Line(agent.Progress{Addr: "a", Done: 1, Elapsed: el}); ok {
			at = append(at, el)
		}
	}
	if want := []time.Duration{12 * time.Second, 21 * time.Second, 30 * time.Second}; !slices.Equal(at, want) {
		t.Errorf("lines at %v, want %v", at, want)
	}
	if line, ok := l.Line(agent.Progress{Addr: "a", Final: true, Done: 10 << 20, Elapsed: 10 * time.Second}); !ok || line != "10.0 MiB in place (10s, 1.0 MiB/s)" {
		t.Errorf("closing line %q %v", line, ok)
	}
	// The same address's next work starts afresh.
	if _, ok := l.Line(agent.Progress{Addr: "a", Done: 1, Elapsed: 5 * time.Second}); ok {
		t.Error("a new download of the same resource printed before its first interval")
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

// On a terminal, the bars of every resource at work are one block below the report's
// lines: a line printed meanwhile (a step's result) erases the block, is written, and the
// block is drawn again below it; one download ending leaves the other's bars.
func TestWorkProgressBarsStayBelowTheReport(t *testing.T) {
	t.Parallel()
	var screen bytes.Buffer // stdout and stderr on one terminal
	v := &View{W: &screen, Term: &screen}
	v.WorkProgress(snapshot) // 3 lines
	other := agent.Progress{Addr: "download.tok", Done: 1 << 20, Total: 2 << 20, Rate: 1 << 20, ETA: time.Second}
	v.WorkProgress(other) // the block: 3 + 1 lines
	screen.Reset()
	v.ApplyEvent(agent.Event{Phase: agent.PhaseDone, Step: &agent.Step{Addr: "file.x", Applied: true, Diff: &agent.Diff{Action: agent.Create}}})
	got := screen.String()
	if !strings.HasPrefix(got, "\x1b[4A\r\x1b[J  ✓ file.x: created and verified (0s)\n") {
		t.Errorf("the result line does not replace the block: %q", got)
	}
	rest := ansi.ReplaceAllString(strings.TrimPrefix(got, "\x1b[4A\r\x1b[J  ✓ file.x: created and verified (0s)\n"), "")
	if strings.Count(rest, "\n") != 4 || !strings.Contains(rest, "download.qwen ") || !strings.Contains(rest, "download.tok ") {
		t.Errorf("the block is not drawn again below the line: %q", rest)
	}
	screen.Reset()
	v.WorkProgress(agent.Progress{Addr: "download.qwen", Final: true, Done: 8 << 30, Elapsed: 32 * time.Second})
	got = screen.String()
	want := "\x1b[4A\r\x1b[J  download.qwen: 8.0 GiB in place (32s, 256.0 MiB/s)\n  download.tok "
	if !strings.HasPrefix(got, want) || strings.Count(got, "\n") != 2 {
		t.Errorf("after download.qwen ended: %q, want its line, then download.tok's bar alone", got)
	}
	screen.Reset()
	v.WorkProgress(agent.Progress{Addr: "download.tok", Final: true, Done: 2 << 20, Elapsed: 2 * time.Second})
	v.printf("done\n")
	if got := screen.String(); got != "\x1b[1A\r\x1b[J  download.tok: 2.0 MiB in place (2s, 1.0 MiB/s)\ndone\n" {
		t.Errorf("after the last download ended: %q", got)
	}
}
