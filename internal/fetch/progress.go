package fetch

import (
	"math"
	"sync"
	"time"
)

// FileState is where a file is in a Fetch.
type FileState int32

const (
	FileQueued FileState = iota
	FileVerifying
	FileDownloading
	FileDone
	FileSkipped
	FileFailed
)

func (s FileState) String() string {
	switch s {
	case FileVerifying:
		return "verifying"
	case FileDownloading:
		return "downloading"
	case FileDone:
		return "done"
	case FileSkipped:
		return "skipped"
	case FileFailed:
		return "failed"
	default:
		return "queued"
	}
}

// FileProgress is one file's progress.
type FileProgress struct {
	Name  string
	State FileState
	Done  int64         // bytes in place (downloaded or hashed so far)
	Total int64         // expected size, -1 unknown
	Rate  float64       // bytes per second, smoothed over a few seconds
	ETA   time.Duration // -1 when unknown
}

// Progress is a snapshot of a Fetch.
type Progress struct {
	Files []FileProgress
	Done  int64 // sum of Done
	Total int64 // sum of known totals
	// Unknown counts files whose total is unknown (not in Total).
	Unknown int
	Rate    float64
	ETA     time.Duration // -1 when unknown
	Final   bool          // the last snapshot of the Fetch
}

// rateWindow is the time constant of the smoothed rate.
const rateWindow = 3 * time.Second

// startProgress calls Options.Progress every ProgressInterval until the returned func is
// called, which delivers the final snapshot.
func (r *run) startProgress(tasks []*task) func() {
	if r.opts.Progress == nil {
		return func() {}
	}
	p := &progressMeter{tasks: tasks, last: make([]int64, len(tasks)), rates: make([]float64, len(tasks)), at: time.Now()}
	for i, t := range tasks {
		p.last[i] = t.moved.Load()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(r.opts.ProgressInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				r.opts.Progress(p.snapshot(now, false))
			}
		}
	})
	return func() {
		close(stop)
		wg.Wait()
		r.opts.Progress(p.snapshot(time.Now(), true))
	}
}

type progressMeter struct {
	tasks []*task
	last  []int64
	rates []float64
	at    time.Time
}

func (p *progressMeter) snapshot(now time.Time, final bool) Progress {
	dt := now.Sub(p.at).Seconds()
	p.at = now
	alpha := 1 - math.Exp(-dt/rateWindow.Seconds())
	out := Progress{Files: make([]FileProgress, len(p.tasks)), Final: final}
	for i, t := range p.tasks {
		moved := t.moved.Load()
		if dt > 0 {
			inst := float64(moved-p.last[i]) / dt
			p.rates[i] += alpha * (inst - p.rates[i])
		}
		p.last[i] = moved
		fp := FileProgress{Name: t.f.Name, State: FileState(t.state.Load()), Done: t.done.Load(), Total: t.total.Load(), Rate: p.rates[i]}
		if fp.State == FileDone || fp.State == FileSkipped || fp.State == FileFailed {
			fp.Rate = 0
		}
		fp.ETA = eta(fp.Done, fp.Total, fp.Rate)
		if fp.State == FileDone || fp.State == FileSkipped {
			fp.ETA = 0
		}
		out.Files[i] = fp
		out.Done += fp.Done
		out.Rate += fp.Rate
		if fp.Total >= 0 {
			out.Total += fp.Total
		} else {
			out.Unknown++
		}
	}
	out.ETA = -1
	if out.Unknown == 0 {
		out.ETA = eta(out.Done, out.Total, out.Rate)
	}
	if final {
		out.Rate, out.ETA = 0, 0
	}
	return out
}

func eta(done, total int64, rate float64) time.Duration {
	if total < 0 || rate <= 0 {
		return -1
	}
	if done >= total {
		return 0
	}
	return time.Duration(float64(total-done) / rate * float64(time.Second))
}
