package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
)

// The server's place, as observe reaches it: the host, or an Incus container (through
// the plan's Incus socket, on this host or another cluster member). Its lifecycle, the
// processes a record names in it, the cluster member that holds it, and a pending
// launch into it settled.

// incusRunner is the Incus runner of the instance name, through the plan's Incus
// socket (one client per socket, shared by runs). Machine.IncusRemote makes it work
// through the Incus API only, as for an instance on another member.
func (s *Server) incusRunner(name string) *lifecycle.Incus {
	return &lifecycle.Incus{Client: s.incus.Client(), Instance: name, Proc: s.host.Proc, Remote: s.host.IncusRemote}
}

// recordProcs observes rec's processes in the PID namespace the record names: this
// host's /proc for a host PID (every record written before namespaces were recorded
// is one, and reads as it always did); inside rec's container, through Incus, for a
// PID of a container on another member, where a container that restarted since holds
// nothing of it.
func (s *Server) recordProcs(ctx context.Context, rec *serverRecord) lifecycle.Procs {
	name, ok := cutIncusPlace(rec.Place)
	if rec.PIDNS == "" || !ok {
		return lifecycle.HostProcs(s.host.Proc)
	}
	return s.incusRunner(name).ProcsIn(ctx, rec.PIDNS)
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
		c := s.incusRunner(name).Client
		if member, err := resources.DownMember(ctx, c, name); err != nil {
			return member, err
		}
		env.Memory.Delete(resources.MemberSeenKey(c, name)) // online: its watch reports its next fall again
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
func (s *Server) recoverPendingRemote(rec *serverRecord) (bool, *agent.RecordUpdate, error) {
	p := *rec.Pending
	name, ok := cutIncusPlace(p.Place)
	if !ok {
		return false, nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := s.incusRunner(name)
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

// lifecycle is the lifecycle of the server's place: the host, or its container (which
// must exist and run; errNoInstance when it does not exist).
func (s *Server) lifecycle(ctx context.Context) (*lifecycle.Lifecycle, error) {
	return s.lifecycleAt(ctx, s.place)
}

// lifecycleAt is the lifecycle of place, "host" or "container NAME": a recorded launch
// is stopped where it runs, also when the plan moved the server. The server's own
// place gets its endpoint; another place is only observed and stopped.
func (s *Server) lifecycleAt(ctx context.Context, place string) (*lifecycle.Lifecycle, error) {
	h := s.host.WithDefaults()
	name, inContainer := strings.CutPrefix(place, lifecycle.IncusPlace(""))
	if !inContainer {
		return &lifecycle.Lifecycle{Place: lifecycle.Local{Proc: h.Proc}, GPU: h.GPU}, nil
	}
	r := s.incusRunner(name)
	c := r.Client
	lc := &lifecycle.Lifecycle{Place: r, GPU: h.GPU}
	if place != s.place || s.Delete {
		return lc, nil // observed and stopped only
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	inst, _, err := c.GetInstance(qctx, name)
	if incus.IsNotFound(err) {
		return nil, fmt.Errorf("container %s: %w", name, errNoInstance)
	}
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", name, resources.ReachErr(c, err))
	}
	if !inst.Running() {
		return nil, fmt.Errorf("container %s is %s: the server runs inside it, so it must run (running = true on its container block, or incus start %s): %w",
			name, strings.ToLower(inst.Status), name, lifecycle.ErrNotRunning)
	}
	if s.port > 0 && (s.ready.HTTP != "" || s.smoke != nil || s.enableMetrics) {
		st, err := c.InstanceState(qctx, name)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", name, err)
		}
		ep, err := lifecycle.IncusEndpoint(inst, st, s.port)
		if err != nil {
			return lc, fmt.Errorf("%w: %w", errNoEndpoint, err)
		}
		r.Endpoints = map[int]string{s.port: ep}
	}
	return lc, nil
}

// recoverPending settles a launch recorded as pending by an agent that stopped before
// recording its process: the live session leader that carries the pending marker (the
// lifecycle starts every server as one) becomes the record, as launched; with none,
// the intent is void. It returns whether a record remains, and the record update that
// says so (the engine keeps it: an observation writes nothing).
func (s *Server) recoverPending(rec *serverRecord) (bool, *agent.RecordUpdate, error) {
	p := *rec.Pending
	if settled, found, err := s.recoverPendingRemote(rec); settled || err != nil {
		return rec.PID > 0, found, err
	}
	all, err := s.host.Proc.All()
	if err != nil {
		return false, nil, fmt.Errorf("look for pending generation %d: %w", p.Generation, err)
	}
	for _, st := range all {
		if st.Dead() || st.PID != st.Session {
			continue
		}
		if envv, err := s.host.Proc.Environ(st.PID); err != nil || !slices.Contains(envv, p.Marker) {
			continue
		}
		p.PID, p.StartTicks, p.PGID, p.SID = st.PID, st.StartTicks, st.PGRP, st.Session
		if boot, err := s.host.Proc.BootTime(); err == nil {
			p.LaunchedAt = proc.StartTime(boot, st.StartTicks)
		}
		*rec = p
		return true, pendingFound(rec, ""), nil
	}
	return voidPending(rec)
}

// pendingFound is the record update of a pending launch found running (in container,
// "" on the host).
func pendingFound(rec *serverRecord, container string) *agent.RecordUpdate {
	where := ""
	if container != "" {
		where = " in container " + container
	}
	return agent.SaveRecord(rec, fmt.Sprintf("adopting the launch of generation %d (pid %d%s), which an agent that stopped before recording it left pending",
		rec.Generation, rec.PID, where))
}

// voidPending forgets a pending launch whose process was not found: the record as it
// was before it, or none. It returns whether a record remains.
func voidPending(rec *serverRecord) (bool, *agent.RecordUpdate, error) {
	why := fmt.Sprintf("the pending launch of generation %d never started", rec.Pending.Generation)
	rec.Pending = nil
	if rec.PID == 0 {
		return false, agent.DeleteRecord(why), nil
	}
	return true, agent.SaveRecord(rec, why), nil
}

// errNoInstance is wrapped when the server's container does not exist (yet).
var errNoInstance = errors.New("container does not exist")

// errNoEndpoint is wrapped when the agent cannot reach the server's port in its
// container; the lifecycle is returned with it, good for everything but HTTP.
var errNoEndpoint = errors.New("server port unreachable from the agent")
