package resources

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/fetch"
)

// progressRecord is a running apply's progress, saved in the resource's state record at most
// once a second so `agent status` in another process can show bytes, rate and ETA.
type progressRecord struct {
	PID        int            `json:"pid"`
	Updated    time.Time      `json:"updated"`
	Done       int64          `json:"done"`
	Total      int64          `json:"total"`
	Rate       float64        `json:"rate"`        // bytes per second
	ETASeconds float64        `json:"eta_seconds"` // -1 unknown
	Files      []fileProgress `json:"files,omitempty"`
}

// fileProgress is one active file of a progressRecord.
type fileProgress struct {
	Name       string  `json:"name"`
	State      string  `json:"state"`
	Done       int64   `json:"done"`
	Total      int64   `json:"total"`
	Rate       float64 `json:"rate"`
	ETASeconds float64 `json:"eta_seconds"`
}

// live reports whether the record belongs to an apply still running: its process exists and
// it wrote the record recently.
func (p *progressRecord) live(now time.Time) bool {
	if p == nil || p.PID <= 0 || now.Sub(p.Updated) > progressStale {
		return false
	}
	err := syscall.Kill(p.PID, 0)
	return err == nil || err == syscall.EPERM
}

// progressReporter turns fetch's snapshots into terminal bars (when there is a terminal)
// and a progress record in state.
type progressReporter struct {
	env   *agent.Env
	addr  string
	rec   *downloadRecord
	term  io.Writer
	mu    sync.Mutex
	lines int // lines drawn last time
	saved time.Time
	start time.Time
}

func newProgressReporter(env *agent.Env, addr string, rec *downloadRecord) *progressReporter {
	return &progressReporter{env: env, addr: addr, rec: rec, term: env.Terminal, start: time.Now()}
}

func etaSeconds(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return d.Seconds()
}

// update receives fetch's snapshots (every 250 ms and a final one).
func (r *progressReporter) update(p fetch.Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p.Final {
		r.erase()
		if r.term != nil && p.Done > 0 {
			el := time.Since(r.start)
			fmt.Fprintf(r.term, "  %s: %s in place (%s, %s/s)\n", r.addr, bytesize.Format(p.Done), el.Round(time.Second), bytesize.Format(int64(float64(p.Done)/max(el.Seconds(), 0.001))))
		}
		return
	}
	active := make([]fetch.FileProgress, 0, 8)
	for _, f := range p.Files {
		if f.State == fetch.FileDownloading || f.State == fetch.FileVerifying {
			active = append(active, f)
		}
	}
	if r.term != nil {
		r.draw(p, active)
	}
	now := time.Now()
	if now.Sub(r.saved) < progressSaveEvery {
		return
	}
	r.saved = now
	rec := &progressRecord{PID: os.Getpid(), Updated: now.UTC(), Done: p.Done, Total: p.Total, Rate: p.Rate, ETASeconds: etaSeconds(p.ETA)}
	for _, f := range active {
		rec.Files = append(rec.Files, fileProgress{Name: f.Name, State: f.State.String(), Done: f.Done, Total: f.Total, Rate: f.Rate, ETASeconds: etaSeconds(f.ETA)})
	}
	r.rec.Progress = rec
	if err := r.env.State.Save(r.rec); err != nil && r.env.Log != nil {
		r.env.Log.Warn("could not record download progress", "err", err)
	}
}

// finish erases the bars; the caller clears the progress record.
func (r *progressReporter) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.erase()
}

const barWidth = 24

// draw redraws one line per active file and a total line in place.
func (r *progressReporter) draw(p fetch.Progress, active []fetch.FileProgress) {
	var b strings.Builder
	if r.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", r.lines)
	}
	lines := 0
	const maxShown = 8
	for i, f := range active {
		if i == maxShown {
			fmt.Fprintf(&b, "\r\x1b[2K    … and %d more files\n", len(active)-maxShown)
			lines++
			break
		}
		name := f.Name
		if len(name) > 40 {
			name = "…" + name[len(name)-39:]
		}
		verb := ""
		if f.State == fetch.FileVerifying {
			verb = " verifying"
		}
		fmt.Fprintf(&b, "\r\x1b[2K    %-40s %s %s%s\n", name, bar(f.Done, f.Total), amounts(f.Done, f.Total, f.Rate, f.ETA), verb)
		lines++
	}
	fmt.Fprintf(&b, "\r\x1b[2K  %-42s %s %s\n", r.addr, bar(p.Done, p.Total), amounts(p.Done, p.Total, p.Rate, p.ETA))
	lines++
	for i := lines; i < r.lines; i++ {
		b.WriteString("\r\x1b[2K\n")
	}
	if r.lines > lines {
		fmt.Fprintf(&b, "\x1b[%dA", r.lines-lines)
	}
	r.lines = lines
	io.WriteString(r.term, b.String())
}

func (r *progressReporter) erase() {
	if r.term == nil || r.lines == 0 {
		return
	}
	fmt.Fprintf(r.term, "\x1b[%dA\r\x1b[J", r.lines)
	r.lines = 0
}

func bar(done, total int64) string {
	if total <= 0 {
		return "[" + strings.Repeat("?", barWidth) + "]"
	}
	n := int(float64(barWidth) * float64(min(done, total)) / float64(total))
	return "[" + strings.Repeat("=", n) + strings.Repeat(" ", barWidth-n) + "]"
}

func amounts(done, total int64, rate float64, eta time.Duration) string {
	t := "?"
	if total >= 0 {
		t = bytesize.Format(total)
	}
	e := "?"
	if eta >= 0 {
		e = eta.Round(time.Second).String()
	}
	return fmt.Sprintf("%9s / %-9s %9s/s  ETA %s", bytesize.Format(done), t, bytesize.Format(int64(rate)), e)
}
