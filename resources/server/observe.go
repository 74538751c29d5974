package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
)

// observation is what Check sees before it decides, gathered once by observe: the
// record (a pending launch settled), the recorded process, the server's place, the
// port's holder, and the judgements the loop keeps (the liveness watch's verdict,
// whether a held change was said). decide reads nothing else.
type observation struct {
	now time.Time
	// has: rec names a launch; stopped: rec was stopped for good (has is false, and a
	// launch continues its generations). found is the record update of a pending launch
	// settled on the way.
	has, stopped bool
	rec          serverRecord
	found        *agent.RecordUpdate
	alive        bool // rec's process runs (in the namespace rec names)
	// missing: the container does not exist yet; noEndpoint: the port cannot be reached
	// from the agent (the place is there otherwise).
	missing, noEndpoint error
	// failure is the failure line of rec's log (its process gone), "" when none.
	failure string
	// probed: the readiness of rec's process was probed; notReady is why it is not
	// ready ("" ready).
	probed   bool
	notReady string
	liveness watchedLiveness
	// gpuAct is a GPU fault to relaunch rec's generation for; gpuHeld the one it was
	// relaunched for already, whose GPU needs a reboot (gpufault.go).
	gpuAct, gpuHeld *gpuFaultIncident
	said            bool // the hold of rec's rejected change was logged already
	holder          portHolding
	// fit is the preflight's verdict for a launch (fits when it cannot tell).
	fitMsg string
	fits   bool
	// warms: a stop of rec's process, alive, would be preceded by a warm-up that has
	// weights to read (warm.go).
	warms bool
}

// portHolding is what holds the server's port when its recorded process does not run.
type portHolding struct {
	err   error      // the port's holders could not be read
	owner *proc.Stat // nil: nobody; else the holder, climbed to its launcher when it runs the plan's server
	// runsPlan: owner runs exactly this server's command line; recordedAs names another
	// record that holds it, ownedBy the live agent that launched it.
	runsPlan            bool
	recordedAs, ownedBy string
	ns                  string // its PID namespace, as a record names it
	nsErr               error
	started             time.Time // when it started (zero: unknown)
	notReady            string    // its readiness, for its adoption
	desc                string    // who it is, for an error or a takeover
}

// observe gathers what Check decides on, through the server's place: the record, a
// pending launch settled, the cluster member of each place it names, the recorded
// process, the place's lifecycle, the log of a process gone, readiness and liveness of
// one alive, what holds the port, and the preflight of a launch. It returns the server
// as it runs now (liveView).
func (s *Server) observe(ctx context.Context, env *agent.Env) (*Server, *observation, error) {
	s = s.liveView(env)
	o := &observation{fits: true}
	rec := &o.rec
	has, err := env.State.Load(rec)
	if err != nil {
		return nil, nil, err
	}
	if has && !rec.StoppedAt.IsZero() {
		o.stopped, has = true, false // stopped for good: a launch is a new start, numbered after it
	}
	places := []string{s.place}
	if has {
		places = append(places, rec.Place)
	}
	if _, err := s.memberDown(ctx, env, places...); err != nil {
		return nil, nil, err
	}
	if has && rec.Pending != nil {
		if has, o.found, err = s.recoverPending(rec); err != nil {
			return nil, nil, err
		}
	}
	o.has = has
	// PIDs and start times in the namespace the record names (place.go).
	if has {
		if o.alive, err = s.recordProcs(ctx, rec).Alive(ctx, rec.id()); err != nil {
			return nil, nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
		}
	}
	lc, err := s.lifecycle(ctx)
	if errors.Is(err, errNoInstance) {
		o.missing, err = err, nil
	}
	if errors.Is(err, errNoEndpoint) {
		o.noEndpoint, err = err, nil
	}
	if err != nil {
		return nil, nil, err
	}
	o.liveness = livenessSeen(env)
	if has {
		o.gpuAct, o.gpuHeld = s.gpuFaultNow(env, rec)
	}
	if r := rec.Rejected; r != nil {
		_, o.said = env.Memory.Load(heldKey(env.Addr, r))
	}
	s.observeProcess(ctx, env, lc, o)
	o.now = env.Now() // after the probes, as a judgement of them reads the clock
	if s.mayLaunch(o) {
		var prev *serverRecord
		if has {
			prev = rec
		}
		o.fitMsg, o.fits = s.preflight(ctx, prev)
		o.warms = s.warmsBeforeStop(ctx, lc, o)
	}
	return s, o, nil
}

// observeProcess observes, on lc, what decide judges the recorded process by: its log's
// failure when it is gone and what holds the port then, its readiness when it runs the
// plan's server (or the rolled-back one the loop keeps).
func (s *Server) observeProcess(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, o *observation) {
	rec := &o.rec
	if o.has && !o.alive {
		if p := hostPath(ctx, lc, rec); p != "" {
			if f, ok := lifecycle.Failure(p); ok {
				o.failure = f.String()
			}
		}
	}
	if !o.alive && o.missing == nil && s.port > 0 {
		var prev *serverRecord
		if o.has {
			prev = rec
		}
		o.holder = s.observeHolder(ctx, env, lc, prev)
	}
	matches := len(s.identityChanges(rec)) == 0
	if o.alive && o.missing == nil && rec.verified() && (matches && o.noEndpoint == nil || !matches && env.Loop && s.rejectedNow(rec) != nil) {
		o.probed, o.notReady = true, s.notReady(ctx, lc, rec)
	}
}

// mayLaunch reports whether decide may launch on o: anything but the recorded process
// running the plan's server, ready and not wedged (or not verified yet).
func (s *Server) mayLaunch(o *observation) bool {
	if !o.alive || len(s.identityChanges(&o.rec)) > 0 {
		return true
	}
	return o.probed && (o.notReady != "" || o.liveness.wedged(&o.rec))
}

// observeHolder observes what holds the port besides prev's launch: whether it runs the
// plan's server, and then whether another record or agent holds it and what an
// adoption records of it; else who it is.
func (s *Server) observeHolder(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, prev *serverRecord) portHolding {
	var h portHolding
	procs := lc.Place.Procs(ctx)
	h.owner, h.err = s.portHolder(ctx, procs, prev)
	if h.err != nil || h.owner == nil {
		return h
	}
	if h.runsPlan = s.matches(ctx, procs, h.owner); !h.runsPlan {
		h.desc = describeProc(ctx, procs, h.owner.PID)
		return h
	}
	if h.recordedAs = recordedElsewhere(env, h.owner); h.recordedAs != "" {
		return h
	}
	if h.ownedBy = ownedElsewhere(ctx, procs, env, h.owner.PID); h.ownedBy != "" {
		return h
	}
	if h.ns, h.nsErr = lc.Namespace(ctx); h.nsErr != nil {
		return h
	}
	if st, err := procStart(ctx, procs, h.owner.StartTicks); err == nil {
		h.started = st
	}
	adopt := s.adopted(prev, &h)
	h.notReady = s.notReady(ctx, lc, &adopt)
	return h
}

// ownedElsewhere names the state directory of another live agent that launched pid (the
// AGENT_OWNER its launch carries, whose directory still has that identity), or "" when
// it is this state directory's, or no agent's that still exists.
func ownedElsewhere(ctx context.Context, procs lifecycle.Procs, env *agent.Env, pid int) string {
	environ, err := procs.Environ(ctx, pid)
	if err != nil || env.State == nil {
		return ""
	}
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, state.OwnerEnv+"=")
		if !ok {
			continue
		}
		id, dir, ok := state.ParseOwnerMark(v)
		if !ok {
			return ""
		}
		if mine, _ := state.OwnerOf(env.State.Dir()); mine == id {
			return ""
		}
		if live, err := state.OwnerOf(dir); err != nil || live != id {
			return "" // that state directory is gone or was remade: nobody owns it now
		}
		return dir + " (owner " + id + ")"
	}
	return ""
}

// hostPath is where the agent reads rec's log: through its place's lifecycle when
// that is lc's, on the host for a host record; "" when it cannot be read.
func hostPath(ctx context.Context, lc *lifecycle.Lifecycle, rec *serverRecord) string {
	if rec.LogPath == "" {
		return ""
	}
	if lc != nil && lc.Place.Name() == rec.Place {
		p, err := lc.Place.HostPath(ctx, rec.LogPath)
		if err != nil {
			return ""
		}
		return p
	}
	if rec.Place == (lifecycle.Local{}).Name() || rec.Place == "" {
		return rec.LogPath
	}
	return ""
}

// notReady probes readiness once; "" means ready. ready.http is the live probe; the
// log line counts only when there is no HTTP probe (it says the server came up, not
// that it still works).
func (s *Server) notReady(ctx context.Context, lc *lifecycle.Lifecycle, rec *serverRecord) string {
	if s.ready.HTTP != "" {
		if err := lc.ProbeHTTP(ctx, s.port, s.ready.HTTP); err != nil {
			return err.Error()
		}
		return ""
	}
	if s.ready.LogLine != "" && rec.LogPath != "" && rec.ReadyAt.IsZero() {
		// A generation's log only grows: once its launch saw the line (ReadyAt), it is
		// there for good, however much log follows it.
		p := hostPath(ctx, lc, rec)
		if p == "" {
			return "log: " + rec.LogPath + " cannot be read in " + rec.Place
		}
		m, err := lifecycle.ScanLog(ctx, p)
		if err != nil {
			return "log: " + err.Error()
		}
		if !m.Ready && !logHas(ctx, p, s.ready.LogLine) {
			return fmt.Sprintf("%q not in generation %d's log", s.ready.LogLine, rec.Generation)
		}
	}
	return ""
}

// logHas reports whether a line of the file at path contains line, reading the whole
// file (a launch the agent did not see get ready, such as an adopted one, has no
// ReadyAt; the line may be far from the end).
func logHas(ctx context.Context, path, line string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	const maxLine = 1 << 20
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if len(data) >= maxLine || atEOF && len(data) > 0 {
			return len(data), data, nil // the end, or a giant line in pieces
		}
		return 0, nil, nil
	})
	for sc.Scan() {
		if ctx.Err() != nil {
			return false
		}
		if strings.Contains(sc.Text(), line) {
			return true
		}
	}
	return false
}

// portHolder returns the process listening on the port that is not part of the
// previous launch (whose leftovers the stop takes care of), or nil.
func (s *Server) portHolder(ctx context.Context, procs lifecycle.Procs, prev *serverRecord) (*proc.Stat, error) {
	pids, err := procs.PortOwners(ctx, s.port)
	if err != nil {
		return nil, fmt.Errorf("port %d: %w", s.port, err)
	}
	for _, pid := range pids {
		st, err := procs.Stat(ctx, pid)
		if err != nil || st.Dead() {
			continue
		}
		if prev != nil {
			mine, err := ours(ctx, procs, st, prev)
			if err != nil {
				return nil, fmt.Errorf("port %d is held by pid %d; whether it is generation %d's: %w", s.port, pid, prev.Generation, err)
			}
			if mine {
				continue
			}
		}
		return &st, nil
	}
	return nil, nil
}

// ours reports whether st belongs to the recorded launch: whether a stop of it would
// stop st. The stop's rule (proc.Target.Members) is the only one, so that observation
// and stop never disagree: a process called ours that the stop leaves alone would hold
// the port through the relaunch, one called foreign that the stop would kill blocks the
// launch with "port held" (internal/proc's TestMembersIsTheOneRule lists where an older
// rule of its own differed).
func ours(ctx context.Context, procs lifecycle.Procs, st proc.Stat, rec *serverRecord) (bool, error) {
	members, err := procs.Members(ctx, rec.target(), nil)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(members, func(m proc.Stat) bool { return m.Identity() == st.Identity() }), nil
}

// matches reports whether a process the agent did not start runs exactly this server:
// the same argv, the declared environment, and the declared workdir when one is set.
// It returns the stat of its topmost ancestor with the same argv (the launcher).
func (s *Server) matches(ctx context.Context, procs lifecycle.Procs, st *proc.Stat) bool {
	want := s.argv()
	argv, err := procs.Cmdline(ctx, st.PID)
	if err != nil || !slices.Equal(argv, want) {
		return false
	}
	// Climb to the launcher: SGLang's children keep the parent's argv.
	for st.PPID > 1 {
		parent, err := procs.Stat(ctx, st.PPID)
		if err != nil || parent.Dead() {
			break
		}
		pargv, err := procs.Cmdline(ctx, parent.PID)
		if err != nil || !slices.Equal(pargv, want) {
			break
		}
		*st = parent
	}
	if len(s.env) > 0 {
		env, err := procs.Environ(ctx, st.PID)
		if err != nil {
			return false
		}
		for k, v := range s.env {
			if !slices.Contains(env, k+"="+v) {
				return false
			}
		}
	}
	if s.workdir != defaultWorkdir {
		if cwd, err := procs.Cwd(ctx, st.PID); err != nil || cwd != s.workdir {
			return false
		}
	}
	return s.sameUser(ctx, procs, st.PID)
}

// foreignTarget stops a process the agent did not start: its group and session only
// when it leads them.
func foreignTarget(st proc.Stat) proc.Target {
	t := proc.Target{Leader: st.Identity()}
	if st.PGRP == st.PID {
		t.PGID = st.PGRP
	}
	if st.Session == st.PID {
		t.SID = st.Session
	}
	return t
}

func describeProc(ctx context.Context, procs lifecycle.Procs, pid int) string {
	d := "pid " + strconv.Itoa(pid)
	if argv, err := procs.Cmdline(ctx, pid); err == nil && len(argv) > 0 {
		d += " " + strconv.Quote(strings.Join(argv, " "))
	}
	if _, uid, err := procs.UIDs(ctx, pid); err == nil {
		d += " (uid " + strconv.FormatUint(uint64(uid), 10) + ")"
	}
	return d
}

func procStart(ctx context.Context, procs lifecycle.Procs, ticks uint64) (time.Time, error) {
	boot, err := procs.BootTime(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return proc.StartTime(boot, ticks), nil
}

// recordedElsewhere names another server record (not stopped) that holds the process
// st: a server never adopts what another record names, so two records never name one PID.
func recordedElsewhere(env *agent.Env, st *proc.Stat) string {
	holder := ""
	state.EachRecord(env.State.Others(), "server", func(addr string, rec serverRecord) bool {
		if rec.StoppedAt.IsZero() && rec.PID == st.PID && rec.StartTicks == st.StartTicks {
			holder = addr
		}
		return holder == ""
	})
	return holder
}
