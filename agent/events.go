package agent

import "time"

// What the engine tells its views while it works, as data: an Event per step of an apply
// or destroy, and Progress of long work within a step. The engine and the kinds never
// print; internal/view draws both for people (on a terminal or in a log) and the
// reconcile loop logs them.

// Phase is what an Event says of its step.
type Phase string

const (
	// PhaseStart: the step's Diff is known and the engine is about to act on it.
	PhaseStart Phase = "start"
	// PhaseDone: the step's Err and Applied are final.
	PhaseDone Phase = "done"
	// PhaseFinished: the break work of a Finisher is done and verified (Step.Finished).
	PhaseFinished Phase = "finished"
)

// Progress is where a long step of one resource stands (a download's bytes), reported by
// its kind through Env.Progress every fraction of a second while it works, and once more
// with Final set when that work ends. Byte counts are bytes; a total or an ETA that is not
// known is -1.
type Progress struct {
	// Addr is the resource (set by the engine).
	Addr  string
	Done  int64
	Total int64
	// Rate is bytes per second, smoothed over the last seconds.
	Rate float64
	ETA  time.Duration
	// Elapsed is how long the work has run.
	Elapsed time.Duration
	// Files are the files in flight (downloading or verifying), in the kind's order.
	Files []FileProgress
	// Final is the last report of this work: views close what they drew.
	Final bool
}

// FileProgress is one file of a Progress.
type FileProgress struct {
	Name string
	// Verifying: the file is complete and its checksum is being computed.
	Verifying bool
	Done      int64
	Total     int64
	Rate      float64
	ETA       time.Duration
}

// Progress reports where env's step stands to whoever listens (OnProgress); it does
// nothing when nobody does. A kind calls it from the goroutine doing the work.
func (env *Env) Progress(p Progress) {
	if env == nil || env.OnProgress == nil {
		return
	}
	p.Addr = env.Addr
	env.OnProgress(p)
}

// Degraded reports whether a status report has an unhealthy or failed resource.
func (r *Report) Degraded() bool {
	for _, st := range r.Steps {
		if st.Err != nil || st.Status == nil || !st.Status.Healthy {
			return true
		}
	}
	return false
}
