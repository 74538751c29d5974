package daemon

import (
	"bytes"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
)

// In the journal, a long download logs where it stands every 30 s of its time (bytes,
// rate, ETA, also as attributes for machines) and one closing line; nothing between,
// nothing for short work. The work's own Elapsed is the clock: 95 s run in no time.
func TestLogProgressEvery30s(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	d := &Daemon{log: slog.New(slog.NewTextHandler(&buf, nil))}
	const total = 8 << 30
	for el := time.Duration(0); el <= 95*time.Second; el += 250 * time.Millisecond {
		done := int64(el / time.Second * 64 << 20)
		d.logProgress(agent.Progress{Addr: "download.qwen", Done: done, Total: total, Rate: 64 << 20, ETA: time.Duration(total-done) / (64 << 20) * time.Second, Elapsed: el})
		if el < 20*time.Second {
			d.logProgress(agent.Progress{Addr: "download.tok", Done: 1 << 20, Total: 2 << 20, Rate: 1 << 20, ETA: time.Second, Elapsed: el})
		}
	}
	d.logProgress(agent.Progress{Addr: "download.tok", Final: true, Done: 2 << 20, Total: 2 << 20, Elapsed: 20 * time.Second})
	d.logProgress(agent.Progress{Addr: "download.qwen", Final: true, Done: total, Total: total, Elapsed: 128 * time.Second})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=INFO msg="download.qwen: 1.9 GiB of 8.0 GiB (23%), 64.0 MiB/s, ETA 1m38s" resource=download.qwen done_bytes=2013265920 total_bytes=8589934592 rate_bytes_per_second=67108864 eta_seconds=98 elapsed=30s`,
		`level=INFO msg="download.qwen: 3.8 GiB of 8.0 GiB (46%), 64.0 MiB/s, ETA 1m8s" resource=download.qwen done_bytes=4026531840 total_bytes=8589934592 rate_bytes_per_second=67108864 eta_seconds=68 elapsed=1m0s`,
		`level=INFO msg="download.qwen: 5.6 GiB of 8.0 GiB (70%), 64.0 MiB/s, ETA 38s" resource=download.qwen done_bytes=6039797760 total_bytes=8589934592 rate_bytes_per_second=67108864 eta_seconds=38 elapsed=1m30s`,
		`level=INFO msg="download.qwen: 8.0 GiB in place (2m8s, 64.0 MiB/s)" resource=download.qwen done_bytes=8589934592 elapsed=2m8s`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	stamp := regexp.MustCompile(`^time=\S+ `)
	for i, l := range lines {
		if got := stamp.ReplaceAllString(l, ""); got != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, got, want[i])
		}
	}
}

// The loop's engine reports progress to the log unless the caller listens itself.
func TestEngineOptionsLogProgress(t *testing.T) {
	t.Parallel()
	d := &Daemon{log: slog.New(slog.DiscardHandler)}
	if d.engineOptions().Progress == nil {
		t.Error("the loop's engine reports progress to nobody")
	}
}
