package lifecycle

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/engines"
)

// ScanLog reads a log it read before on from where it stopped, and what it returns is
// what a scan of the whole log returns: the corpus's real logs, written in pieces cut
// anywhere (mid-line too), with a ScanLog after each piece.
func TestScanLogReadOnIsAWholeScan(t *testing.T) {
	logs, _ := filepath.Glob("../engines/testdata/real/*.log")
	more, _ := filepath.Glob("../engines/testdata/*.log")
	logs = append(logs, more...)
	if len(logs) < 10 {
		t.Fatalf("the corpus has %d logs", len(logs))
	}
	ctx := context.Background()
	for _, src := range logs {
		t.Run(filepath.Base(src), func(t *testing.T) {
			text, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if len(text) > 0 && text[len(text)-1] != '\n' {
				text = append(text, '\n') // a line counts once whole
			}
			path := filepath.Join(t.TempDir(), "server.log")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for i := 0; i < len(text); {
				n := min(len(text)-i, 1+(i*7919)%997) // pieces of 1 to 997 bytes
				if _, err := f.Write(text[i : i+n]); err != nil {
					t.Fatal(err)
				}
				i += n
				if _, err := ScanLog(ctx, path); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ScanLog(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			want, err := engines.ScanMetrics(ctx, strings.NewReader(string(text)))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("read on in pieces:\n%+v\nthe whole log at once:\n%+v", got, want)
			}
			if off := logScans.follower(path).off; off != int64(len(text)) {
				t.Errorf("the follower stands at byte %d of %d", off, len(text))
			}
		})
	}
}

// A log replaced by another file (a rename over it), even a longer one, is read from its
// beginning, not on from where the old one ended.
func TestScanLogReadsAReplacedLogAgain(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "server.log")
	batch := "[2026-12-03 10:00:01 TP0] Decode batch, #running-req: 1, #token: 100, token usage: 0.01, cuda graph: True, gen throughput (token/s): 60.00, #queue-req: 0, \n"
	if err := os.WriteFile(path, []byte(batch), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := ScanLog(context.Background(), path); err != nil || m.Events != 1 {
		t.Fatalf("first: %d batch lines, %v", m.Events, err)
	}
	other := filepath.Join(dir, "new")
	if err := os.WriteFile(other, []byte(strings.Repeat("plain text of another server\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, path); err != nil {
		t.Fatal(err)
	}
	if m, err := ScanLog(context.Background(), path); err != nil || m.Events != 0 {
		t.Fatalf("after the log was replaced: %d batch lines (want 0: another text), %v", m.Events, err)
	}
}

// A log rewritten in place (truncated and written again, longer than before) is read
// from its beginning too: the follower checks the bytes before where it stopped.
func TestScanLogReadsARewrittenLogAgain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	batch := "[2026-12-03 10:00:01 TP0] Decode batch, #running-req: 1, #token: 100, token usage: 0.01, cuda graph: True, gen throughput (token/s): 60.00, #queue-req: 0, \n"
	if err := os.WriteFile(path, []byte(batch+batch), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := ScanLog(context.Background(), path); err != nil || m.Events != 2 {
		t.Fatalf("first: %d batch lines, %v", m.Events, err)
	}
	if err := os.WriteFile(path, []byte(batch+strings.Repeat("plain text of another run\n", 20)), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := ScanLog(context.Background(), path); err != nil || m.Events != 1 {
		t.Fatalf("after the log was rewritten: %d batch lines (want 1), %v", m.Events, err)
	}
}

// A follower started in the morning reads a vLLM line of the afternoon (month-day times,
// no year) as today's, not last year's: each read takes the year from its own now.
func TestLogFollowerTakesTheYearFromEachRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	f := FollowLog(path)
	clock := time.Date(2026, 12, 3, 9, 0, 0, 0, time.Local)
	f.now = func() time.Time { return clock }
	f.restart()
	line := "INFO 12-03 %s [loggers.py:259] Engine 000: Avg prompt throughput: 600.0 tokens/s, Avg generation throughput: 204.3 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.3%, Prefix cache hit rate: 0.0%\n"
	if err := os.WriteFile(path, []byte(fmtLine(line, "08:59:00")), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := f.Read(); err != nil {
		t.Fatal(err)
	}
	clock = time.Date(2026, 12, 3, 15, 0, 0, 0, time.Local)
	w, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString(fmtLine(line, "14:59:30"))
	w.Close()
	m, _, _, err := f.Read()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 12, 3, 14, 59, 30, 0, time.Local); !m.LastLineTime.Equal(want) {
		t.Errorf("the afternoon's line read as %s, want %s", m.LastLineTime, want)
	}
}

func fmtLine(format, hms string) string { return strings.Replace(format, "%s", hms, 1) }
