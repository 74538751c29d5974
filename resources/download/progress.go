package download

import (
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/agent-dev/agent/agent"
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

// progressReporter passes fetch's snapshots on as data (Env.Progress: the views draw
// them) and keeps a progress record in state.
type progressReporter struct {
	env   *agent.Env
	rec   *downloadRecord
	mu    sync.Mutex
	saved time.Time
	start time.Time
	// reported: a snapshot went out and no final one yet.
	reported bool
}

func newProgressReporter(env *agent.Env, rec *downloadRecord) *progressReporter {
	return &progressReporter{env: env, rec: rec, start: time.Now()}
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
	out := agent.Progress{Done: p.Done, Total: p.Total, Rate: p.Rate, ETA: p.ETA, Elapsed: time.Since(r.start), Final: p.Final}
	if p.Final {
		r.reported = false
		r.env.Progress(out)
		return
	}
	active := make([]fetch.FileProgress, 0, 8)
	for _, f := range p.Files {
		if f.State == fetch.FileDownloading || f.State == fetch.FileVerifying {
			active = append(active, f)
			out.Files = append(out.Files, agent.FileProgress{Name: f.Name, Verifying: f.State == fetch.FileVerifying,
				Done: f.Done, Total: f.Total, Rate: f.Rate, ETA: f.ETA})
		}
	}
	r.reported = true
	r.env.Progress(out)
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

// end closes what the views drew when fetch ended without its final snapshot; the
// caller clears the progress record.
func (r *progressReporter) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reported {
		r.reported = false
		r.env.Progress(agent.Progress{Final: true, Total: -1, ETA: -1, Elapsed: time.Since(r.start)})
	}
}
