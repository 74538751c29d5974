package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/proc"
)

// remote reports whether the place works through the Incus API only: always with
// Remote set, else when the instance's cluster member is not the one the agent's
// Incus socket belongs to (GET /1.0/cluster's server_name). An instance outside a
// cluster, or on this member, is local: its processes are in this host's /proc, read
// faster, and watched with a pidfd. The answer is kept for the place's life (one
// value per run). An error (the instance cannot be read) decides nothing.
func (r *Incus) remote(ctx context.Context) (bool, error) {
	if r.Remote {
		return true, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mode != 0 {
		return r.mode == modeRemote, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	inst, _, err := r.Client.GetInstance(ctx, r.Instance)
	if err != nil {
		return false, fmt.Errorf("container %s: %w", r.Instance, err)
	}
	r.mode = modeLocal
	if inst.Location != "" && inst.Location != "none" {
		cl, err := r.Client.Cluster(ctx)
		if err != nil {
			r.mode = 0
			return false, fmt.Errorf("container %s: which member this agent is on: %w", r.Instance, err)
		}
		if cl.Enabled && cl.ServerName != inst.Location {
			r.mode = modeRemote
		}
	}
	return r.mode == modeRemote, nil
}

// Place modes (Incus.mode).
const (
	modeLocal  = 1
	modeRemote = 2
)

// IsRemote reports whether the place works through the Incus API only (see remote).
func (r *Incus) IsRemote(ctx context.Context) (bool, error) { return r.remote(ctx) }

// ProcsIn observes and stops processes whose PIDs belong to the PID namespace ns, as a
// record names it (Started.NS): "" is this host's, whose processes are read in its
// /proc (every record written before namespaces were recorded is one); another is the
// instance's own, read through exec, where a namespace that is no longer the
// instance's holds nothing. Ports are always looked up where the instance runs.
func (r *Incus) ProcsIn(ctx context.Context, ns string) Procs {
	if ns != "" {
		return remoteProcs{r: r, ns: ns}
	}
	if remote, err := r.remote(ctx); err == nil && remote {
		return hostPIDsRemotePorts{hostProcs: hostProcs{r.Proc}, ports: remoteProcs{r: r}}
	}
	return incusProcs{hostProcs: hostProcs{r.Proc}, r: r}
}

// hostPIDsRemotePorts is a host-PID record of an instance that now runs elsewhere:
// its processes are looked for on this host (where they were), its port where the
// instance runs.
type hostPIDsRemotePorts struct {
	hostProcs
	ports remoteProcs
}

func (p hostPIDsRemotePorts) PortOwners(ctx context.Context, port int) ([]int, error) {
	return p.ports.PortOwners(ctx, port)
}

func (p hostPIDsRemotePorts) PortFree(ctx context.Context, port int, wait time.Duration) error {
	return p.ports.PortFree(ctx, port, wait)
}

// identScript prints the stat line of PID $1, then its command line.
const identScript = nsScript + `[ -e /proc/$1/stat ] || exit 3
{ read -r s </proc/$1/stat; } 2>/dev/null || exit 3
echo "$s"
cat /proc/$1/cmdline 2>/dev/null
exit 0
`

// startRemote finishes a launch in remote mode: the stopped shell the launch printed
// as nsPID, found inside by its tag, recorded in the instance's namespace, then let
// run; its log directory pruned inside.
func (r *Incus) startRemote(ctx context.Context, nsPID int, tag string, log LogFile) (*Started, error) {
	ns, st, err := r.identifyRemote(ctx, nsPID, tag)
	p := remoteProcs{r: r, ns: ns}
	kill := func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout())
		defer cancel()
		_ = p.Signal(kctx, proc.Target{}, []proc.Stat{st}, syscall.SIGKILL)
	}
	if err != nil {
		if st.PID > 0 {
			kill() // never leave a stopped, unrecorded process
		}
		return nil, fmt.Errorf("start in container %s: %w", r.Instance, err)
	}
	res, err := r.sh(ctx, signalScript, "agent-kill", strconv.Itoa(int(syscall.SIGCONT)), "0", fmt.Sprintf("%d:%d:-", st.PID, st.StartTicks))
	if err == nil && (res.ns != ns || !bytes.Contains(res.out, []byte("sent "+strconv.Itoa(st.PID)+"\n"))) {
		err = errors.New("it vanished while stopped")
	}
	if err != nil {
		kill()
		return nil, fmt.Errorf("start in container %s: continue pid %d: %w", r.Instance, st.PID, err)
	}
	started := &Started{ID: st.Identity(), PGID: st.PGRP, SID: st.Session, NS: ns}
	_ = r.pruneRemote(ctx, log)
	return started, nil
}

// identifyRemote is identify inside the instance: PID nsPID, running the stopped
// shell with this launch's tag, stopped, leading its session and group. A process it
// found by its tag but gives up on is returned with the error, to be killed.
func (r *Incus) identifyRemote(ctx context.Context, nsPID int, tag string) (string, proc.Stat, error) {
	deadline := time.Now().Add(10 * time.Second)
	var why string
	var tagged proc.Stat
	for {
		res, err := r.sh(ctx, identScript, "agent-ident", strconv.Itoa(nsPID))
		var st proc.Stat
		var argv []string
		if err == nil && res.code == 0 {
			line, rest, _ := bytes.Cut(res.out, []byte("\n"))
			st, err = proc.ParseStat(line)
			argv = splitNUL(rest)
		} else if err == nil {
			err = fmt.Errorf("pid %d: %w", nsPID, proc.ErrNoProcess)
		}
		if err == nil {
			switch {
			case len(argv) < 4 || argv[1] != "-c" || argv[2] != stoppedScript || argv[3] != tag:
				why = fmt.Sprintf("pid %d (inside) runs %q, not the launch", nsPID, argv)
			case st.Dead():
				return res.ns, st, fmt.Errorf("pid %d (inside) exited before it started the server", nsPID)
			case st.State != 'T':
				tagged = st
				why = fmt.Sprintf("pid %d (inside) did not stop (state %c)", nsPID, st.State)
			case st.Session != st.PID || st.PGRP != st.PID:
				return res.ns, st, fmt.Errorf("pid %d (inside) is not the leader of its session and group (setsid forked?)", nsPID)
			default:
				return res.ns, st, nil
			}
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) {
			return res.ns, tagged, fmt.Errorf("the launched process was not found: %s", why)
		}
		select {
		case <-ctx.Done():
			return res.ns, tagged, fmt.Errorf("the launched process was not found: %s: %w", why, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pruneRemote removes the oldest generations' logs beyond log.Keep inside the
// instance, never the current one's.
func (r *Incus) pruneRemote(ctx context.Context, log LogFile) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	names, err := r.Client.ListFiles(ctx, r.Instance, log.Dir)
	if err != nil {
		return err
	}
	gens := generationsOf(names, log.Name)
	keep := max(log.Keep, 1)
	var victims []string
	for i := 0; i < len(gens)-keep; i++ {
		if gens[i] != log.Generation {
			victims = append(victims, LogPath(log.Dir, log.Name, gens[i]))
		}
	}
	if len(victims) == 0 {
		return nil
	}
	_, err = r.sh(ctx, nsScript+`rm -f -- "$@"`, "agent-prune", victims...)
	return err
}

// mirrorDir is the directory holding the copies of files read from instances in remote
// mode: <tmp>/agent-incus-files-<euid>, mode 0700, shared by this user's agent
// processes so that copies are overwritten rather than left behind by each `agent
// status`. One that is not a directory of this user with mode 0700 (planted by another
// user) is never used: a private directory of this process's replaces it.
var mirrorDir = sync.OnceValues(func() (string, error) {
	dir := filepath.Join(os.TempDir(), "agent-incus-files-"+strconv.Itoa(os.Geteuid()))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || fi.Mode().Perm() != 0o700 || int(st.Uid) != os.Geteuid() {
		return os.MkdirTemp("", "agent-incus-files-")
	}
	return dir, nil
})

// mirrorFresh is how long a copy serves before the next read pulls the file again:
// a readiness wait looks at a growing log every DefaultPoll.
const mirrorFresh = 250 * time.Millisecond

// mirror is HostPath in remote mode: p pulled through the Incus file API into the
// mirror directory, and the copy's path. A directory becomes a directory of empty
// files named as its entries (the agent only lists log directories); a missing file
// is a missing copy, so that a read fails as it would inside. A symlink is followed
// (relative to its directory) up to 8 times. The copy is of the moment of the call.
func (r *Incus) mirror(ctx context.Context, p string) (string, error) {
	root, err := mirrorDir()
	if err != nil {
		return "", fmt.Errorf("container %s: a directory for copies of its files: %w", r.Instance, err)
	}
	clean := path.Clean(p)
	local := filepath.Join(root, r.Instance, filepath.FromSlash(clean))
	r.mu.Lock()
	if t, ok := r.pulled[clean]; ok && time.Since(t) < mirrorFresh {
		r.mu.Unlock()
		return local, nil
	}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	src := clean
	for range 8 {
		data, info, err := r.Client.PullFile(ctx, r.Instance, src)
		switch {
		case incus.IsNotFound(err):
			if err := os.RemoveAll(local); err != nil {
				return "", err
			}
		case err != nil && info.Type == "directory":
			if err := r.mirrorDirectory(ctx, src, local); err != nil {
				return "", err
			}
		case err != nil:
			return "", fmt.Errorf("container %s: read %s: %w", r.Instance, p, err)
		case info.Type == "symlink":
			target := strings.TrimSpace(string(data))
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(src), target)
			}
			src = path.Clean(target)
			continue
		default:
			if err := writeCopy(local, data); err != nil {
				return "", fmt.Errorf("container %s: copy of %s: %w", r.Instance, p, err)
			}
		}
		r.mu.Lock()
		if r.pulled == nil {
			r.pulled = map[string]time.Time{}
		}
		r.pulled[clean] = time.Now()
		r.mu.Unlock()
		return local, nil
	}
	return "", fmt.Errorf("container %s: %s: too many levels of symbolic links", r.Instance, p)
}

// forgetCopy makes the next HostPath of p pull it again, however fresh its copy.
func (r *Incus) forgetCopy(p string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pulled, path.Clean(p))
}

func (r *Incus) mirrorDirectory(ctx context.Context, dir, local string) error {
	names, err := r.Client.ListFiles(ctx, r.Instance, dir)
	if err != nil {
		return fmt.Errorf("container %s: list %s: %w", r.Instance, dir, err)
	}
	if fi, err := os.Lstat(local); err == nil && !fi.IsDir() {
		_ = os.Remove(local)
	}
	if err := os.MkdirAll(local, 0o700); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, n := range names {
		if n == "" || n == "." || n == ".." || strings.Contains(n, "/") {
			continue
		}
		keep[n] = true
		f := filepath.Join(local, n)
		if _, err := os.Lstat(f); errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				return err
			}
		}
	}
	entries, err := os.ReadDir(local)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			_ = os.RemoveAll(filepath.Join(local, e.Name()))
		}
	}
	return nil
}

// writeCopy replaces local with data, atomically (a reader never sees half a copy).
func writeCopy(local string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(local), 0o700); err != nil {
		return err
	}
	if fi, err := os.Lstat(local); err == nil && fi.IsDir() {
		if err := os.RemoveAll(local); err != nil {
			return err
		}
	}
	f, err := os.CreateTemp(filepath.Dir(local), ".copy-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), local); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// WatchRemote blocks until id, in the instance's namespace ns, is gone (nil) or ctx
// ends: a look every every, each an exec inside (no pidfd reaches another member). A look that fails (the member does not answer)
// proves nothing and is repeated; a stopped or restarted instance is a death.
func (r *Incus) WatchRemote(ctx context.Context, ns string, id proc.Identity, every time.Duration) error {
	p := remoteProcs{r: r, ns: ns}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if alive, err := p.Alive(ctx, id); err == nil && !alive {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Namespace is the PID namespace of the processes Place.Procs observes now (what
// Started.NS says of a launch): "" for this host's; for an instance reached through
// Incus only, the instance's (Incus.Namespace).
func (l *Lifecycle) Namespace(ctx context.Context) (string, error) {
	r, ok := l.Place.(*Incus)
	if !ok {
		return "", nil
	}
	if remote, err := r.remote(ctx); err != nil || !remote {
		return "", err
	}
	return r.Namespace(ctx)
}

// FindMarked returns the live session leaders inside the instance whose environment
// holds marker, with the namespace their PIDs belong to: how a launch recorded only as
// an intent (the agent stopped before recording its process) is found in remote mode.
func (r *Incus) FindMarked(ctx context.Context, marker string) ([]proc.Stat, string, error) {
	res, err := r.sh(ctx, listScript, "agent-ps", marker)
	if err != nil {
		if errors.Is(r.notRunning(ctx, err), ErrNotRunning) {
			return nil, "", nil
		}
		return nil, "", err
	}
	all, marked := parseList(res.out)
	var found []proc.Stat
	for _, st := range all {
		if marked[st.PID] && !st.Dead() && st.PID == st.Session {
			found = append(found, st)
		}
	}
	return found, res.ns, nil
}
