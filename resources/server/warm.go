package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/warm"
	"github.com/agent-dev/agent/resources"
)

// A planned relaunch costs a warm start (docs/server.md "Warm relaunch"): before a
// planned stop of a serving generation, the next generation's weights are read into the
// page cache while the old one keeps serving (internal/warm: only the pages not
// resident, idle-class readers, within the memory rule); at a launch that stops nothing
// serving (a first launch, after a reboot or a death) the same readers run beside the
// engine's own load. A warm-up never blocks the change: its failure, timeout or skip is
// logged and recorded, and the stop and launch go on.

// ServerWarmConfig is the `warm` block of a server.
type ServerWarmConfig struct {
	Enabled *bool   `hcl:"enabled,optional"`
	Timeout *string `hcl:"timeout,optional"`
	Margin  *string `hcl:"margin,optional"`
}

// warmPlan is the warm block as bound.
type warmPlan struct {
	off     bool
	timeout time.Duration // 0: the ready timeout
	margin  int64         // 0: warm.DefaultMargin
}

// warmRecord is what the warm-up for a generation did, kept in its record.
type warmRecord struct {
	warm.Result
	At time.Time `json:"at"`
	// BeforeStop: it ran before the stop of the generation this one replaced (else beside
	// this one's start).
	BeforeStop bool   `json:"before_stop,omitempty"`
	Error      string `json:"error,omitempty"`
}

const warmedNote = "weights warmed before the stop"

func (s *Server) bindWarm(b *resources.Binder, c *ServerWarmConfig) {
	if c == nil {
		return
	}
	s.warm.off = c.Enabled != nil && !*c.Enabled
	if c.Timeout != nil {
		s.warm.timeout = b.Duration(c.Timeout, 0, "warm", "timeout")
	}
	if c.Margin != nil {
		n, err := bytesize.Parse(*c.Margin)
		if err != nil {
			b.Bad(b.R.Range("warm", "margin"), "Invalid warm.margin", fmt.Sprintf("warm.margin: %v (the memory a warm-up leaves free besides 10 %% of MemAvailable).", err))
		}
		s.warm.margin = max(n, -1)
		if n == 0 {
			s.warm.margin = -1 // none, as written
		}
	}
}

// warmTimeout bounds one warm-up; 0 when warm-ups are off.
func (s *Server) warmTimeout() time.Duration {
	switch {
	case s.warm.off:
		return 0
	case s.warm.timeout > 0:
		return s.warm.timeout
	}
	return s.ready.Timeout
}

// weightPaths are the model paths s's command line names: SGLang's --model-path and
// --speculative-draft-model-path, vLLM's and llama.cpp's --model (-m), and the model
// after `serve` (`vllm serve /models/x`, `sglang serve …`). Only absolute ones count.
func (s *Server) weightPaths() []string {
	paths := []string{
		s.flagValue("model-path", "model", "m"),
		s.flagValue("speculative-draft-model-path", "speculative-draft-model"),
	}
	argv := s.argv()
	if i := slices.Index(argv, "serve"); i >= 0 && i+1 < len(argv) {
		paths = append(paths, argv[i+1])
	}
	return slices.DeleteFunc(paths, func(p string) bool { return !filepath.IsAbs(p) })
}

// errElsewhere: the weights are on another cluster member, whose page cache this agent
// cannot fill (and HostPath would copy them here).
var errElsewhere = errors.New("the server runs on another cluster member: its weights are not warmed from here")

// warmFiles are the files a warm-up reads for s where lc runs it, as host paths.
func (s *Server) warmFiles(ctx context.Context, lc *lifecycle.Lifecycle) ([]string, error) {
	if len(s.weightPaths()) == 0 {
		return nil, nil // a Hub id: nothing local, nothing to ask the place
	}
	if r, ok := lc.Place.(*lifecycle.Incus); ok {
		if remote, err := r.IsRemote(ctx); err != nil || remote {
			return nil, errors.Join(errElsewhere, err)
		}
	}
	var paths []string
	for _, p := range s.weightPaths() {
		hp, err := lc.Place.HostPath(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("the model path %s seen from the host: %w", p, err)
		}
		paths = append(paths, hp)
	}
	return warm.WeightFiles(paths...)
}

// warmUp reads s's weights within its timeout and returns what it did (nil when there
// is nothing to warm: off, no local model path). It logs its outcome; it never fails.
func (s *Server) warmUp(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, beforeStop bool) *warmRecord {
	if s.warm.off {
		return nil
	}
	files, err := s.warmFiles(ctx, lc)
	if (err == nil && len(files) == 0) || errors.Is(err, errElsewhere) {
		return nil
	}
	return s.warmRead(ctx, env, files, err, beforeStop)
}

// warmRead reads files (listed by warmFiles, with listErr when that failed) within the
// warm-up's timeout and returns what it did; it logs its outcome and never fails.
func (s *Server) warmRead(ctx context.Context, env *agent.Env, files []string, listErr error, beforeStop bool) *warmRecord {
	err := listErr
	w := &warmRecord{At: env.Now(), BeforeStop: beforeStop}
	if err == nil {
		ctx, cancel := context.WithTimeoutCause(ctx, s.warmTimeout(), fmt.Errorf("warm.timeout %s", s.warmTimeout()))
		defer cancel()
		w.Result, err = warmWithProgress(ctx, env, files, warm.Options{Root: s.host.Root, Margin: s.warm.margin})
	}
	if errors.Is(err, errLaunchReturned) {
		err = nil // beside a launch: the engine read the rest itself
	}
	log := env.Log.With("files", w.Files, "bytes", w.Bytes, "resident_before", w.ResidentBefore, "read", w.Read, "seconds", fmt.Sprintf("%.2f", w.Seconds))
	switch {
	case errors.Is(err, warm.ErrTooLarge):
		log.Warn("weights not warmed", "reason", w.Skipped)
	case err != nil:
		w.Error = err.Error()
		log.Warn("weights warm-up failed; the change goes on", "error", err)
	default:
		log.Info("weights warmed", "before_stop", beforeStop)
	}
	return w
}

// warmWithProgress runs the warm-up and, from this goroutine, reports where it stands
// every second (env.Progress: bars or a line every 30 s for people, /status and the log
// under agent run), the way a download does: a warm-up of hundreds of GiB takes minutes.
func warmWithProgress(ctx context.Context, env *agent.Env, files []string, o warm.Options) (warm.Result, error) {
	var read, need atomic.Int64
	o.Progress = func(r, n int64) {
		need.Store(n)
		for cur := read.Load(); r > cur && !read.CompareAndSwap(cur, r); cur = read.Load() {
		}
	}
	type outcome struct {
		res warm.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := warm.Warm(ctx, files, o)
		done <- outcome{res, err}
	}()
	start, reported := time.Now(), false
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case out := <-done:
			if reported {
				env.Progress(agent.Progress{Done: out.res.Read, Total: need.Load(), ETA: -1, Elapsed: time.Since(start), Final: true})
			}
			return out.res, out.err
		case <-tick.C:
			el := time.Since(start)
			p := agent.Progress{Done: read.Load(), Total: need.Load(), Elapsed: el, ETA: -1}
			if p.Rate = float64(p.Done) / el.Seconds(); p.Rate > 0 {
				p.ETA = time.Duration(float64(p.Total-p.Done) / p.Rate * float64(time.Second))
			}
			p.Files = []agent.FileProgress{{Name: "weights warm-up", Done: p.Done, Total: p.Total, Rate: p.Rate, ETA: p.ETA}}
			env.Progress(p)
			reported = true
		}
	}
}

// errLaunchReturned ends a warm-up beside a launch: not a failure.
var errLaunchReturned = errors.New("the launch returned")

// warmBeside starts a warm-up beside a launch that stops nothing serving, unless the
// cold starts of these weights measured slower with it (warm.Ledger: the first cold
// start runs the readers, the next one runs without to compare). The function it
// returns ends it (the engine has read what it needed once its launch returned), adds
// the start to the ledger when the launch was verified, and returns what it did.
func (s *Server) warmBeside(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle) func(launched bool) *warmRecord {
	none := func(bool) *warmRecord { return nil }
	if s.warm.off {
		return none
	}
	start := time.Now()
	files, err := s.warmFiles(ctx, lc)
	if (err == nil && len(files) == 0) || errors.Is(err, errElsewhere) {
		return none // nothing here to warm (or measure)
	}
	key, kerr := warm.Key(files)
	if err != nil || kerr != nil {
		w := s.warmRead(ctx, env, files, errors.Join(err, kerr), false) // says why it could not
		return func(bool) *warmRecord { return w }
	}
	ledger := warm.NewLedger(env.State.Dir())
	measure := func(beside bool, cold int64) {
		if err := ledger.Record(key, beside, time.Since(start).Seconds(), cold, env.Now()); err != nil {
			env.Log.Warn("the cold start's figures were not recorded", "error", err)
		}
	}
	if ok, why := ledger.Beside(key); !ok {
		cold, cerr := warm.ColdBytes(files)
		env.Log.Info("weights not warmed beside the start", "reason", why)
		return func(launched bool) *warmRecord {
			if launched && cerr == nil {
				measure(false, cold)
			}
			return &warmRecord{At: env.Now(), Result: warm.Result{Files: len(files), Skipped: why}}
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan *warmRecord, 1)
	go func() { done <- s.warmRead(ctx, env, files, nil, false) }()
	return func(launched bool) *warmRecord {
		cancel(errLaunchReturned)
		w := <-done
		if launched && w != nil && w.Skipped == "" && w.Error == "" {
			measure(true, w.Bytes-w.ResidentBefore)
		}
		return w
	}
}

// plannedStop reports whether d stops a generation for a planned change (its identity:
// a flag, a version) rather than to repair it (unhealthy, wedged, a GPU fault: it does
// not serve, and a warm-up first would only delay the repair; the warm-up then runs
// beside the launch).
func plannedStop(d *agent.Diff) bool {
	det, ok := d.Detail.(*serverDetail)
	if !ok || !det.stop || det.prev == nil || det.prev.PID == 0 || det.migrate {
		return false
	}
	planned := false
	for _, c := range d.Changes {
		switch c.Why() {
		case agent.ReasonUnhealthy, agent.ReasonWedged, agent.ReasonGPUFault, agent.ReasonGone:
			return false
		case agent.ReasonIdentity:
			planned = true
		}
	}
	return planned
}

// warmBeforeStop warms the next generation's weights when d stops a generation that
// serves (alive) for a planned change: it keeps serving meanwhile.
func (s *Server) warmBeforeStop(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, d *agent.Diff) *warmRecord {
	if s.warm.off || !plannedStop(d) {
		return nil
	}
	det := d.Detail.(*serverDetail)
	if alive, err := s.recordProcs(ctx, det.prev).Alive(ctx, det.prev.id()); err != nil || !alive {
		return nil
	}
	return s.warmUp(ctx, env, lc, true)
}

// warmsBeforeStop observes whether a stop of o's recorded process, alive, would be
// preceded by a warm-up with weights to read (listed, not read).
func (s *Server) warmsBeforeStop(ctx context.Context, lc *lifecycle.Lifecycle, o *observation) bool {
	if s.warm.off || !o.alive || lc == nil {
		return false
	}
	files, err := s.warmFiles(ctx, lc)
	return err == nil && len(files) > 0
}

// noteWarm makes a planned restart of a serving generation say that the weights are
// warmed first (o.warms).
func (s *Server) noteWarm(o *observation, d *agent.Diff) {
	if !o.warms || !plannedStop(d) {
		return
	}
	for i, c := range d.Changes {
		if c.EffectOf() == agent.Restarts {
			note := "restart"
			if c.Note != "" {
				note = c.Note
			}
			d.Changes[i].Note = note + ", " + warmedNote
			return
		}
	}
}

// statusWarm adds the figures of the generation's warm-up.
func statusWarm(st *agent.Status, rec *serverRecord) {
	w := rec.Warm
	if w == nil {
		return
	}
	when := "beside its start"
	if w.BeforeStop {
		when = "before the stop of the generation before it"
	}
	text := fmt.Sprintf("read %s of %s (%s resident before) in %.1f s, %s", bytesize.Format(w.Read), bytesize.Format(w.Bytes), bytesize.Format(w.ResidentBefore), w.Seconds, when)
	switch {
	case w.Skipped != "":
		text = "skipped: " + w.Skipped
	case w.Error != "":
		text = fmt.Sprintf("failed after %s read in %.1f s: %s", bytesize.Format(w.Read), w.Seconds, w.Error)
	}
	st.Fields = append(st.Fields,
		agent.TextField("warm", "warm-up", text),
		agent.BytesField("warm_read_bytes", "warm-up: read", w.Read),
		agent.BytesField("warm_resident_before_bytes", "warm-up: resident before", w.ResidentBefore),
		agent.NumberField("warm_seconds", "warm-up: seconds", w.Seconds).WithText(fmt.Sprintf("%.2f s", w.Seconds)))
	st.Metrics["warm_seconds"] = w.Seconds
	st.Metrics["warm_bytes"] = float64(w.Read)
}
