package server

import (
	"context"
	"encoding/binary"
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
)

var _ agent.Watcher = (*Server)(nil)

// watchPoll is how often a watch without a pidfd (a fake procfs in tests, an old kernel)
// looks at /proc.
const watchPoll = 500 * time.Millisecond

// WatchProbeEvery is how often the watch of a ready server with a ready.http probe asks
// that probe, so that a readiness regression (a hung scheduler, a wedged GPU) is noticed
// within seconds, not at the next resync. One loopback GET: negligible at idle.
const WatchProbeEvery = 5 * time.Second

// Watch returns as soon as the recorded server process exits, so that `agent run`
// relaunches a crashed server within a second instead of at its next resync. It watches
// the process by identity (PID and start time) through a pidfd, which the kernel makes
// readable when that very process exits, whether it is the agent's child or not, so a
// reused PID can never look alive. A server in a container is watched the same way: the
// record holds its host PID, and the container's processes are the host's; one in a
// container on another cluster member is looked at inside through Incus every
// RemoteWatchEvery (below). With no
// recorded process (never launched, a launch in flight) there is nothing to watch.
//
// A server last observed ready, verified, that has a ready.http probe is also probed
// every WatchProbeEvery: the first failed probe returns, and the loop's Check judges
// (the unhealthy_grace applies). One already found unready is left to the resync, so
// that a server within its grace is not observed again and again. Its liveness check
// (server_liveness.go) runs here too: Watch returns once the engine is proven wedged,
// and Check relaunches it.
func (s *Server) watchServer(ctx context.Context, env *agent.Env) error {
	var rec serverRecord
	has, err := env.State.Load(&rec)
	if err != nil {
		return err
	}
	if !has || rec.Pending != nil || rec.PID <= 0 {
		return agent.ErrNothingToWatch
	}
	s = s.liveView(env)
	if s.port <= 0 || !rec.UnreadySince.IsZero() || rec.Place != s.place || !rec.verified() {
		return s.watchRecord(ctx, env, &rec)
	}
	lc, err := s.lifecycle(ctx)
	if err != nil {
		return s.watchRecord(ctx, env, &rec)
	}
	live := s.startLiveness(env, &rec, hostPath(ctx, lc, &rec))
	if s.ready.HTTP == "" && live == nil {
		return s.watchRecord(ctx, env, &rec)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited := make(chan error, 1)
	go func() { exited <- s.watchRecord(ctx, env, &rec) }()
	var ready <-chan time.Time
	if s.ready.HTTP != "" {
		t := time.NewTicker(WatchProbeEvery)
		defer t.Stop()
		ready = t.C
	}
	var due <-chan time.Time
	var wedged <-chan struct{}
	var next *time.Timer
	if live != nil {
		wedged = live.wedgedCh()
		next = time.NewTimer(max(live.due().Sub(env.Now()), 0))
		defer next.Stop()
		due = next.C
	}
	for {
		select {
		case err := <-exited:
			return err
		case <-wedged:
			return nil // the evidence is logged; Check decides
		case <-due:
			live.probe(env, lc, s.port)
			next.Reset(max(live.due().Sub(env.Now()), 0))
		case <-ready:
			if err := lc.ProbeHTTP(ctx, s.port, s.ready.HTTP); err != nil && ctx.Err() == nil {
				env.Log.Info("readiness probe failed; observing the server now", "pid", rec.PID, "error", err)
				return nil
			}
		}
	}
}

// watchProcess blocks until id exits (nil) or ctx ends (ctx's error).
func watchProcess(ctx context.Context, fs proc.FS, id proc.Identity) error {
	if fs.Root == "" || fs.Root == proc.DefaultRoot {
		fd, err := unix.PidfdOpen(id.PID, 0)
		if errors.Is(err, unix.ESRCH) {
			return nil // already gone
		}
		if err == nil {
			defer unix.Close(fd)
			// Checked after opening: the pidfd names the process whose start time this
			// read, not one that reused the PID since.
			alive, err := fs.Alive(id)
			if err == nil && !alive {
				return nil
			}
			if err == nil {
				return pollExit(ctx, fd)
			}
		}
	}
	t := time.NewTicker(watchPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if alive, err := fs.Alive(id); err == nil && !alive {
				return nil
			}
		}
	}
}

// pollExit waits until the pidfd is readable (its process exited) or ctx ends. An
// eventfd wakes the poll when ctx ends: no timer, no wake-up while nothing happens.
func pollExit(ctx context.Context, pidfd int) error {
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return err
	}
	defer unix.Close(wake)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			var one [8]byte
			binary.NativeEndian.PutUint64(one[:], 1)
			unix.Write(wake, one[:])
		case <-done:
		}
	}()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(wake), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if fds[0].Revents != 0 {
			return nil
		}
		if fds[1].Revents != 0 {
			return ctx.Err()
		}
	}
}

// RemoteWatchEvery is how often the watch of a server in a container on another
// cluster member looks at its process (an exec inside through Incus: no pidfd reaches
// another kernel), so that its death is noticed within about this long.
const RemoteWatchEvery = time.Second

// watchRecord blocks until rec's process exits (nil) or ctx ends: by pidfd for a host
// PID (watchProcess), by a look inside every RemoteWatchEvery for a PID of a container
// on another member.
func (s *Server) watchRecord(ctx context.Context, env *agent.Env, rec *serverRecord) error {
	name, ok := cutIncusPlace(rec.Place)
	if rec.PIDNS == "" || !ok {
		return watchProcess(ctx, s.host.Proc, rec.id())
	}
	// The member holding the instance is watched too: one whose incusd hangs answers
	// no look inside, and the process would read as alive until the next resync.
	r := s.incusRunner(name)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	exited, down := make(chan error, 1), make(chan error, 1)
	go func() { exited <- r.WatchRemote(ctx, rec.PIDNS, rec.id(), RemoteWatchEvery) }()
	go func() { down <- resources.WatchMember(ctx, env, r.Client, name) }()
	for {
		select {
		case err := <-exited:
			return err
		case err := <-down:
			if !errors.Is(err, agent.ErrNothingToWatch) {
				return err
			}
			down = nil // on no cluster member: the process alone
		}
	}
}
