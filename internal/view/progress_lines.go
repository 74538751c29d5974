package view

import (
	"fmt"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
)

// DefaultProgressEvery is how often long work says where it stands where bars cannot be
// redrawn in place (a file, a pipe, the journal): as systemd's "A start job is running
// for … (30s / 1min 30s)", a line every 30 s, so that a 52 GB download is not an hour
// of silence, and a log is not flooded either.
const DefaultProgressEvery = 30 * time.Second

// ProgressLines turns long work's progress into a line every Every of its elapsed time:
// the view of progress for output that is not a terminal. It goes by the work's own
// Elapsed (agent.Progress), not by a clock of its own. The zero value is ready to use;
// it is safe for concurrent use.
type ProgressLines struct {
	// Every is the interval (DefaultProgressEvery when zero).
	Every time.Duration
	mu    sync.Mutex
	// next is, per resource, the Elapsed at which its next line is due; said, whether a
	// line was printed for its work in progress.
	next map[string]time.Duration
	said map[string]bool
}

// Line returns what to print of p now, if anything: "3.0 GiB of 8.0 GiB (37%), 300.0
// MiB/s, ETA 17s" once each interval of the work's elapsed time (the first after one
// interval), and, when the work ends, "8.0 GiB in place (1m2s, 132.0 MiB/s)" if a line was
// printed for it before: short work says nothing beyond its step's own lines.
func (l *ProgressLines) Line(p agent.Progress) (string, bool) { return l.line(p, l.Every) }

// line is Line with every as the interval.
func (l *ProgressLines) line(p agent.Progress, every time.Duration) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next == nil {
		l.next, l.said = map[string]time.Duration{}, map[string]bool{}
	}
	if every <= 0 {
		every = DefaultProgressEvery
	}
	if p.Final {
		said := l.said[p.Addr]
		delete(l.next, p.Addr)
		delete(l.said, p.Addr)
		if !said || p.Done <= 0 {
			return "", false
		}
		return inPlace(p), true
	}
	next, ok := l.next[p.Addr]
	if !ok {
		next = every
	}
	if p.Elapsed < next {
		l.next[p.Addr] = next
		return "", false
	}
	l.next[p.Addr] = (p.Elapsed/every + 1) * every
	l.said[p.Addr] = true
	return standing(p), true
}

// Standing is where work stands in words: "6.2 MiB of 24.0 MiB (25%), 1.2 MiB/s, ETA
// 15s" (agent run's /status for a download in flight).
func Standing(p agent.Progress) string { return standing(p) }

// standing is where work stands in words: bytes done of the total, rate, ETA.
func standing(p agent.Progress) string {
	s := bytesize.Format(p.Done)
	if p.Total > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", bytesize.Format(p.Total), int(100*min(p.Done, p.Total)/p.Total))
	}
	s += ", " + bytesize.Format(int64(p.Rate)) + "/s, ETA "
	if p.ETA >= 0 && p.Total > 0 {
		s += p.ETA.Round(time.Second).String()
	} else {
		s += "unknown"
	}
	return s
}

// inPlace is the closing line of work that ended: what is in place, how long it took,
// at what rate.
func inPlace(p agent.Progress) string {
	el := p.Elapsed
	return fmt.Sprintf("%s in place (%s, %s/s)", bytesize.Format(p.Done), el.Round(time.Second), bytesize.Format(int64(float64(p.Done)/max(el.Seconds(), 0.001))))
}
