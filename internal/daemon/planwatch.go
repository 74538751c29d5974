package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/atomicfile"
	"github.com/agent-dev/agent/plans"
)

// DefaultLoadTimeout bounds one load of the plan (reading its files, var files and what
// file() reads, then type-checking). Plans load in milliseconds; one that takes this
// long reads from something that blocks (a hung network filesystem), and the loop must
// not wait for it: the last good plan keeps running and /healthz says so.
const DefaultLoadTimeout = 30 * time.Second

// loadResult is one load of the plan, numbered.
type loadResult struct {
	id    int
	p     *plans.Plan
	diags hcl.Diagnostics
	took  time.Duration
}

// loadAsync loads the plan in a goroutine of its own and sends the result to out: the
// loop never waits on a read (a reload never holds the loop or a signal).
func (d *Daemon) loadAsync(id int, out chan<- loadResult) {
	go func() {
		began := time.Now()
		p, diags := d.cfg.Load()
		out <- loadResult{id: id, p: p, diags: diags, took: time.Since(began)}
	}()
}

// loadNow loads the plan at start, under the load timeout: Run fails when it does not
// end (there is no last good plan to keep).
func (d *Daemon) loadNow(ctx context.Context) (*plans.Plan, hcl.Diagnostics, error) {
	out := make(chan loadResult, 1)
	d.loadAsync(0, out)
	limit := orDefault(d.cfg.LoadTimeout, DefaultLoadTimeout)
	select {
	case r := <-out:
		return r.p, r.diags, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-time.After(limit):
		return nil, nil, d.loadTimedOut(limit)
	}
}

func (d *Daemon) loadTimedOut(limit time.Duration) error {
	return fmt.Errorf("plan %s: loading it did not finish within %s: one of its files blocks on read (%s); the agent opens regular files only, so look for a hung network filesystem",
		d.cfg.PlanPath, limit, strings.Join(d.inputList(), ", "))
}

// reloads is the loop's side of reloading: at most one load runs at a time; a trigger
// while one runs asks for another once it ends (the edit may have come after its read);
// a load past its deadline is abandoned (its late result is dropped) and reported, and
// the next trigger starts a fresh one.
type reloads struct {
	d       *Daemon
	results chan loadResult
	id      int       // the current load's number; 0 when none runs
	began   time.Time // when it started
	again   bool      // a trigger came while it ran
	seq     int
	timer   *time.Timer
}

func (d *Daemon) newReloads() *reloads {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &reloads{d: d, results: make(chan loadResult, 8), timer: t}
}

// trigger starts a load, or asks for one after the load in flight.
func (r *reloads) trigger() {
	if r.id != 0 {
		r.again = true
		return
	}
	r.seq++
	r.id, r.began, r.again = r.seq, time.Now(), false
	r.d.setLoading(r.began)
	r.d.notify.reloading()
	r.timer.Reset(orDefault(r.d.cfg.LoadTimeout, DefaultLoadTimeout))
	r.d.loadAsync(r.id, r.results)
}

// done installs a load's result (dropping an abandoned one) and starts the next load
// when a trigger came meanwhile.
func (r *reloads) done(res loadResult) {
	if res.id != r.id {
		r.d.log.Info("a plan load that had passed its deadline ended; its result is dropped", "took", res.took.Round(time.Millisecond).String())
		return
	}
	r.id = 0
	r.timer.Stop()
	r.d.setLoading(time.Time{})
	if err := r.d.install(res.p, res.diags); err != nil {
		r.d.log.Error("the new plan is invalid; the last good plan keeps running", "error", err)
	} else {
		r.d.mu.Lock()
		n := len(r.d.eng.Addrs())
		r.d.mu.Unlock()
		r.d.log.Info("plan loaded", "plan", r.d.cfg.PlanPath, "resources", n)
	}
	r.d.notify.ready(r.d.summaryLine())
	if r.again {
		r.trigger()
	}
}

// expired abandons the load in flight: it is reported as the plan's error, and the next
// trigger (or the one that came meanwhile) starts afresh.
func (r *reloads) expired() {
	if r.id == 0 {
		return
	}
	limit := orDefault(r.d.cfg.LoadTimeout, DefaultLoadTimeout)
	err := r.d.rejected(r.d.loadTimedOut(limit))
	r.d.log.Error("the new plan did not load in time; the last good plan keeps running", "error", err)
	r.id = 0
	r.d.setLoading(time.Time{})
	r.d.notify.ready(r.d.summaryLine())
	if r.again {
		r.trigger()
	}
}

// setLoading records when the load in flight began (zero: none), for /healthz.
func (d *Daemon) setLoading(at time.Time) {
	d.mu.Lock()
	d.loading = at
	d.mu.Unlock()
}

// noteInputs adds a load's inputs to those watched: the last good plan's and the last
// attempt's (a var file that vanished is watched for its return).
func (d *Daemon) noteInputs(p *plans.Plan, good bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p == nil {
		return
	}
	if good {
		d.goodInputs = slices.Clone(p.Inputs)
	}
	d.triedInputs = slices.Clone(p.Inputs)
	d.mu.Unlock()
	stamp := d.inputStamp()
	d.mu.Lock()
	d.loadedStamp = stamp
	if d.inputsChanged != nil {
		select {
		case d.inputsChanged <- struct{}{}:
		default:
		}
	}
}

// inputStamp is what stat says of every input (or that it is missing): a different stamp
// means a file changed.
func (d *Daemon) inputStamp() string {
	var b strings.Builder
	for _, p := range d.inputList() {
		st, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(&b, "%s\x00missing\x00", p)
			continue
		}
		var ino uint64
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			ino = sys.Ino
		}
		fmt.Fprintf(&b, "%s\x00%d\x00%d\x00%d\x00", p, st.Size(), st.ModTime().UnixNano(), ino)
	}
	return b.String()
}

// inputList is every path watched for changes: the plan path and the inputs of the last
// good plan and of the last load.
func (d *Daemon) inputList() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	add := func(p string) {
		if abs, err := filepath.Abs(p); err == nil {
			p = abs
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	add(d.cfg.PlanPath)
	for _, p := range d.goodInputs {
		add(p)
	}
	for _, p := range d.triedInputs {
		add(p)
	}
	return out
}

// inputWatch is what the fsnotify watch follows: the directories holding the plan's
// inputs (editors and `git pull` replace a file by rename, which a watch on the file
// loses), and which names in them matter.
type inputWatch struct {
	files   map[string]bool // inputs, and where their symlinks lead
	planDir string          // the plan when it is a directory: any *.hcl added there counts
	dirs    map[string]bool // directories to watch
}

func (d *Daemon) wantedWatch() *inputWatch {
	iw := &inputWatch{files: map[string]bool{}, dirs: map[string]bool{}}
	planAbs, _ := filepath.Abs(d.cfg.PlanPath)
	if st, err := os.Stat(planAbs); err == nil && st.IsDir() {
		iw.planDir = planAbs
		iw.dirs[planAbs] = true
		if real, err := filepath.EvalSymlinks(planAbs); err == nil && real != planAbs {
			iw.planDir = real
			iw.dirs[real] = true
		}
	}
	for _, in := range d.inputList() {
		if in == planAbs && iw.planDir != "" {
			continue
		}
		names := []string{in}
		if real, err := filepath.EvalSymlinks(in); err == nil && real != in {
			names = append(names, real) // a git checkout's file behind /etc/agent/plan.hcl
		}
		for _, n := range names {
			iw.files[n] = true
			iw.dirs[existingDir(filepath.Dir(n))] = true
		}
	}
	return iw
}

// existingDir is dir, or its nearest ancestor that exists (hosts/ removed by a checkout
// of another branch): its creation is an event there.
func existingDir(dir string) string {
	for {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return dir
		}
		dir = up
	}
}

// relevant reports whether an event on name may change the plan.
func (iw *inputWatch) relevant(name string) bool {
	if iw.files[name] {
		return true
	}
	if iw.planDir != "" && filepath.Dir(name) == iw.planDir && filepath.Ext(name) == ".hcl" {
		return true
	}
	for f := range iw.files { // a directory on the way to an input appeared or went
		if strings.HasPrefix(f, name+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// watch reports (debounced) changes of any file the plan was loaded from: its plan files,
// its var files and what file() read, wherever they live. The set follows each load.
func (d *Daemon) watch(ctx context.Context) (<-chan struct{}, func()) {
	out := make(chan struct{}, 1)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		d.log.Warn("cannot watch the plan; reload with SIGHUP", "error", err)
		return out, func() {}
	}
	refresh := make(chan struct{}, 1)
	d.mu.Lock()
	d.inputsChanged = refresh
	d.mu.Unlock()
	var mu sync.Mutex
	cur := &inputWatch{dirs: map[string]bool{}}
	apply := func() {
		want := d.wantedWatch()
		mu.Lock()
		defer mu.Unlock()
		for dir := range cur.dirs {
			if !want.dirs[dir] {
				w.Remove(dir)
			}
		}
		for dir := range want.dirs {
			if cur.dirs[dir] {
				continue
			}
			if err := w.Add(dir); err != nil {
				d.log.Warn("cannot watch a directory of the plan's files; reload with SIGHUP after editing there", "dir", dir, "error", err)
			}
		}
		cur = want
	}
	apply()
	d.log.Debug("watching the plan's files", "files", strings.Join(d.inputList(), ","))
	// An edit between the load and now (the wait for an operator's lock can be long)
	// had no watch to see it: compared by stat, and reloaded.
	d.mu.Lock()
	loaded := d.loadedStamp
	d.mu.Unlock()
	if loaded != d.inputStamp() {
		d.log.Info("the plan's files changed since they were loaded")
		out <- struct{}{}
	}
	go func() {
		var fire <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case <-refresh:
				apply()
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				mu.Lock()
				hit := cur.relevant(ev.Name)
				mu.Unlock()
				if hit {
					d.log.Debug("a plan file changed", "file", ev.Name, "op", ev.Op.String())
					apply() // a directory that appeared, a symlink that moved
					fire = time.After(debounce)
				}
			case <-w.Errors:
			case <-fire:
				fire = nil
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, func() { w.Close() }
}

// RunFile is the file in the state directory where a running loop says where it
// answers: `agent status` reads it when the plan does not load (a var file gone), to show
// the daemon's view of the host instead of failing on what it cannot read.
const RunFile = "daemon.json"

// RunInfo is RunFile's content.
type RunInfo struct {
	PID    int       `json:"pid"`
	Plan   string    `json:"plan"`
	Listen string    `json:"listen"`
	Since  time.Time `json:"since"`
}

// writeRunFile records where this loop answers, once it holds the state lock.
func (d *Daemon) writeRunFile(listen string) {
	d.mu.Lock()
	dir := d.store.Dir()
	d.mu.Unlock()
	b, _ := json.MarshalIndent(RunInfo{PID: os.Getpid(), Plan: d.cfg.PlanPath, Listen: listen, Since: time.Now().UTC()}, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(dir, RunFile), append(b, '\n'), 0o600); err != nil {
		d.log.Warn("cannot record where the loop answers; agent status needs a plan that loads", "error", err)
	}
}

// ReadRunFile reads the state directory's RunFile.
func ReadRunFile(stateDir string) (RunInfo, error) {
	var ri RunInfo
	b, err := os.ReadFile(filepath.Join(stateDir, RunFile))
	if err != nil {
		return ri, err
	}
	return ri, json.Unmarshal(b, &ri)
}
