package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
)

// RemoteWatchEvery is how often the watch of a server in a container on another
// cluster member looks at its process (an exec inside through Incus: no pidfd reaches
// another kernel), so that its death is noticed within about this long.
const RemoteWatchEvery = time.Second

// incusRunner is the Incus runner of the instance name, through the plan's Incus
// socket (one client per socket, shared by runs). Machine.IncusRemote makes it work
// through the Incus API only, as for an instance on another member.
func (s *Server) incusRunner(env *agent.Env, name string) *lifecycle.Incus {
	explicit := ""
	if env != nil && env.Plan != nil {
		explicit = env.Plan.Agent.IncusSocket
	}
	sock := incus.SocketPath(explicit)
	clients := s.clients
	if clients == nil { // a Server built by hand (tests): no cache
		clients = new(sync.Map)
	}
	cached, _ := clients.LoadOrStore(sock, incus.New(sock))
	return &lifecycle.Incus{Client: cached.(*incus.Client), Instance: name, Proc: s.host.Proc, Remote: s.host.IncusRemote}
}

// recordProcs observes rec's processes in the PID namespace the record names: this
// host's /proc for a host PID (every record written before namespaces were recorded
// is one, and reads as it always did); inside rec's container, through Incus, for a
// PID of a container on another member, where a container that restarted since holds
// nothing of it.
func (s *Server) recordProcs(ctx context.Context, env *agent.Env, rec *serverRecord) lifecycle.Procs {
	name, ok := cutIncusPlace(rec.Place)
	if rec.PIDNS == "" || !ok {
		return lifecycle.HostProcs(s.host.Proc)
	}
	return s.incusRunner(env, name).ProcsIn(ctx, rec.PIDNS)
}

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
	r := s.incusRunner(env, name)
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

// memberDown returns the member and the cluster's word on it (the container kind's
// DownMember: the member, its status and message, and the fix) when one of places is a
// container on a cluster member the cluster reports not online; "" and nil otherwise.
// Asked before any look inside: each is forwarded to that member, and one whose incusd
// hangs answers none of them (an observation waited out every look's deadline, 20-30 s,
// for "context deadline exceeded"), while the cluster's database answers this from any
// member.
func (s *Server) memberDown(ctx context.Context, env *agent.Env, places ...string) (string, error) {
	for i, place := range places {
		name, ok := cutIncusPlace(place)
		if !ok || slices.Contains(places[:i], place) {
			continue
		}
		if member, err := resources.DownMember(ctx, env.Memory, s.incusRunner(env, name).Client, name); err != nil {
			return member, err
		}
	}
	return "", nil
}

// cutIncusPlace is the instance name of a place "container NAME".
func cutIncusPlace(place string) (string, bool) {
	name, ok := strings.CutPrefix(place, lifecycle.IncusPlace(""))
	return name, ok && name != ""
}

// recoverPendingRemote is recoverPending for a launch into a container the runner
// reaches through Incus only: the marked session leader is looked for inside, and
// recorded in the container's namespace. It reports whether it settled the pending
// launch (false: the container is local, look on the host), with the record update.
func (s *Server) recoverPendingRemote(env *agent.Env, rec *serverRecord) (bool, *agent.RecordUpdate, error) {
	p := *rec.Pending
	name, ok := cutIncusPlace(p.Place)
	if !ok {
		return false, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := s.incusRunner(env, name)
	remote, err := r.IsRemote(ctx)
	if incus.IsNotFound(err) || (err == nil && !remote) {
		return false, nil, nil
	}
	if err != nil {
		return false, nil, fmt.Errorf("look for pending generation %d in container %s: %w", p.Generation, name, err)
	}
	found, ns, err := r.FindMarked(ctx, p.Marker)
	if err != nil {
		return false, nil, fmt.Errorf("look for pending generation %d in container %s: %w", p.Generation, name, err)
	}
	if len(found) == 0 {
		_, upd, err := voidPending(rec)
		return true, upd, err
	}
	st := found[0]
	p.PID, p.StartTicks, p.PGID, p.SID, p.PIDNS = st.PID, st.StartTicks, st.PGRP, st.Session, ns
	if boot, err := r.ProcsIn(ctx, ns).BootTime(ctx); err == nil {
		p.LaunchedAt = proc.StartTime(boot, st.StartTicks)
	}
	*rec = p
	return true, pendingFound(rec, name), nil
}
