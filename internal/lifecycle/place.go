package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/trust"
)

// Spec is what to run: the exact identity of a server.
type Spec struct {
	// Argv is the exact command line; Argv[0] is looked up in PATH when it has no slash.
	Argv []string
	// Env is the declared environment. The process gets Env over a small base taken
	// from the agent's own environment (BaseEnv) plus Marker.
	Env map[string]string
	// Workdir is the working directory ("/" when empty).
	Workdir string
	// User runs the process as this user (name or uid); empty: the agent's user.
	User string
	// Marker is an exact KEY=VALUE entry added to the environment, inherited by every
	// descendant, so a stop finds children that left the session (proc.Target.Marker).
	Marker string
	// Home is the process's HOME, made (mode 0700, owned by User) when missing: Python,
	// Hugging Face and Triton keep their caches under ~, and a service manager may give
	// the agent no HOME, or a read-only one. Empty: User's home from passwd when User is
	// set, else the agent's own HOME (BaseEnv); in a container, the user's home there.
	Home string
}

// BaseEnv names the variables a launched process inherits from the agent: enough to
// find programs and libraries, nothing that changes from one agent start to the next.
// Everything else must be declared, so the launched identity is the declared one.
var BaseEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "TZ"}

// Environ returns the environment the process is started with on the host: BaseEnv
// from the agent's own (PATH defaulting to DefaultPath), the declared variables over
// it, sorted, then the marker.
func (s Spec) Environ() []string {
	base := map[string]string{"PATH": DefaultPath}
	for _, k := range BaseEnv {
		if v, ok := os.LookupEnv(k); ok {
			base[k] = v
		}
	}
	if s.Home != "" {
		base["HOME"] = s.Home
	}
	return s.environOver(base)
}

// JITCacheEnv is where a server's just-in-time compilers keep their caches, under its
// HOME, so that a relaunch, and a reboot, finds the kernels the last generation
// compiled (minutes of a start). TorchInductor's default is
// /tmp/torchinductor_<user> (torch/_inductor/runtime/cache_dir_utils.py), and Triton's,
// under TorchInductor, <that>/triton/<device>: a transient unit may get a private /tmp,
// and a reboot empties it. FlashInfer appends .cache/flashinfer to its base. vLLM's
// (VLLM_CACHE_ROOT, ~/.cache/vllm) and SGLang's DeepGEMM cache (~/.cache/deep_gemm)
// already follow HOME. These are defaults under the declared variables: only a declared
// cache location is part of a server's identity.
func JITCacheEnv(home string) map[string]string {
	if home == "" {
		return nil
	}
	return map[string]string{
		"TRITON_CACHE_DIR":          filepath.Join(home, ".cache", "triton"),
		"TORCHINDUCTOR_CACHE_DIR":   filepath.Join(home, ".cache", "torchinductor"),
		"FLASHINFER_WORKSPACE_BASE": home,
	}
}

// environOver returns base with the JIT caches under its HOME and the declared
// variables over it, as sorted KEY=VALUE entries, then the marker (last, so that it is
// never sorted among them).
func (s Spec) environOver(base map[string]string) []string {
	m := maps.Clone(base)
	home := m["HOME"]
	if h, ok := s.Env["HOME"]; ok {
		home = h
	}
	maps.Copy(m, JITCacheEnv(home))
	maps.Copy(m, s.Env)
	out := make([]string, 0, len(m)+1)
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	if s.Marker != "" {
		out = append(out, s.Marker)
	}
	return out
}

// Started is a process a Place launched.
type Started struct {
	// ID is the leader's PID and start time, read right after the start.
	ID proc.Identity
	// PGID and SID are the leader's process group and session (its own PID when the
	// place used Setsid).
	PGID, SID int
	// NS names the PID namespace of ID, PGID and SID: "" for this host's; for a
	// process of an instance the agent reaches only through Incus (on another
	// cluster member), the instance's own (Incus.Namespace). A record keeps it, so that
	// its PIDs are never read in another namespace (Lifecycle.ProcsIn).
	NS string
	// Exited, when not nil, is closed once the place has seen the leader exit;
	// ExitStatus then says how ("exit status 1", "signal: killed").
	Exited     <-chan struct{}
	ExitStatus func() string
}

// Procs is what the lifecycle reads and does to the processes of one place: this
// host's /proc (also for processes inside local containers, seen there with host PIDs),
// or an instance's own /proc read through Incus exec (remoteProcs). Every call takes
// the caller's context: a look inside an instance on another cluster member is an
// exec that ctx bounds and cancels. Which processes make up a server is one rule for
// both (proc.Target.Members).
type Procs interface {
	Stat(ctx context.Context, pid int) (proc.Stat, error)
	Alive(ctx context.Context, id proc.Identity) (bool, error)
	Cmdline(ctx context.Context, pid int) ([]string, error)
	Environ(ctx context.Context, pid int) ([]string, error)
	Cwd(ctx context.Context, pid int) (string, error)
	UIDs(ctx context.Context, pid int) (real, effective uint32, err error)
	BootTime(ctx context.Context) (time.Time, error)
	PortOwners(ctx context.Context, port int) ([]int, error)
	PortFree(ctx context.Context, port int, wait time.Duration) error
	Stop(ctx context.Context, t proc.Target, sig syscall.Signal, timeout time.Duration) (proc.Report, error)
	// Members returns the processes a Stop of t would aim at now (proc.Target.Members
	// over this place's processes; known as in proc.Namespace), signalling nothing:
	// observation asks the stop's own rule which processes are a launch's.
	Members(ctx context.Context, t proc.Target, known map[proc.Identity]proc.Stat) ([]proc.Stat, error)
}

// HostProcs is this host's /proc (fs) as Procs.
func HostProcs(fs proc.FS) Procs { return hostProcs{fs} }

// hostProcs is this host's /proc as Procs. Reading it never blocks, so ctx bounds only
// the waits (PortFree, Stop).
type hostProcs struct{ fs proc.FS }

var _ Procs = hostProcs{}

func (p hostProcs) Stat(_ context.Context, pid int) (proc.Stat, error) { return p.fs.Stat(pid) }
func (p hostProcs) Alive(_ context.Context, id proc.Identity) (bool, error) {
	return p.fs.Alive(id)
}
func (p hostProcs) Cmdline(_ context.Context, pid int) ([]string, error) { return p.fs.Cmdline(pid) }
func (p hostProcs) Environ(_ context.Context, pid int) ([]string, error) { return p.fs.Environ(pid) }
func (p hostProcs) Cwd(_ context.Context, pid int) (string, error)       { return p.fs.Cwd(pid) }
func (p hostProcs) UIDs(_ context.Context, pid int) (real, effective uint32, err error) {
	return p.fs.UIDs(pid)
}
func (p hostProcs) BootTime(context.Context) (time.Time, error) { return p.fs.BootTime() }
func (p hostProcs) PortOwners(_ context.Context, port int) ([]int, error) {
	return p.fs.PortOwners(port)
}
func (p hostProcs) PortFree(ctx context.Context, port int, wait time.Duration) error {
	return p.fs.PortFree(ctx, port, wait)
}
func (p hostProcs) Members(_ context.Context, t proc.Target, known map[proc.Identity]proc.Stat) ([]proc.Stat, error) {
	return p.fs.Members(t, known)
}
func (p hostProcs) Stop(ctx context.Context, t proc.Target, sig syscall.Signal, timeout time.Duration) (proc.Report, error) {
	return p.fs.Stop(ctx, t, sig, timeout)
}

// LogFile is one launch generation's log: <Dir>/<Name>.<Generation>.log, with
// <Dir>/<Name>.log a symlink to it and Keep generations kept. Paths are the place's
// own: inside a container, they are the container's paths.
type LogFile struct {
	Dir, Name  string
	Generation int
	// Keep is how many generations' logs to keep, this one included.
	Keep int
}

// Path is the generation's log file.
func (f LogFile) Path() string { return LogPath(f.Dir, f.Name, f.Generation) }

// Place is where a server runs: this machine (Local), or an Incus instance (Incus).
// A place starts processes, observes and stops them, reaches their ports and reads
// their files; the rest of the lifecycle is the same code for every place.
type Place interface {
	// Name names the place, for the launched identity and for messages: "host",
	// "container sglang".
	Name() string
	// Start launches s detached: in a session and process group of its own, with
	// stdin from /dev/null and stdout and stderr appended to log.Path(). Start makes
	// log.Dir, refuses a <Name>.log that is not a symlink, creates the generation's
	// file, which must not exist yet (ErrLogExists), points <Name>.log at it and
	// prunes generations beyond log.Keep. It does not wait for anything but the start
	// itself, and ctx does not bound the process's life. When it returns an error with
	// a non-nil *Started, the process runs (a later step failed).
	Start(ctx context.Context, s Spec, log LogFile) (*Started, error)
	// Procs observes and stops processes of this place. PIDs are the host's, except
	// for an instance on another cluster member (see Incus.Procs); ctx bounds the
	// question of which that is.
	Procs(ctx context.Context) Procs
	// Endpoint is the host:port where this place's port is reached from the agent.
	Endpoint(port int) string
	// HostPath is where the agent reads a file of this place (a log file).
	HostPath(ctx context.Context, path string) (string, error)
}

// Local is this machine as a place: servers run as its processes, seen in its /proc.
type Local struct {
	// Proc reads /proc; the zero value reads the real one.
	Proc proc.FS
}

var _ Place = Local{}

// Name is "host".
func (Local) Name() string { return "host" }

// Procs is h.Proc.
func (h Local) Procs(context.Context) Procs { return hostProcs{h.Proc} }

// Endpoint is 127.0.0.1:port.
func (Local) Endpoint(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// HostPath is path itself.
func (Local) HostPath(_ context.Context, path string) (string, error) { return path, nil }

// ErrLogExists is wrapped when a launch would reuse an existing log file.
var ErrLogExists = errors.New("log file of this generation already exists")

// Start launches s with Setsid, its log file as stdout and stderr.
func (h Local) Start(ctx context.Context, s Spec, log LogFile) (*Started, error) {
	if len(s.Argv) == 0 {
		return nil, errors.New("start: empty command")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The log directory and those above it must be root's (internal/trust): another
	// user who could write there could plant the generation's file or the current link.
	if err := trust.Dir(log.Dir); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	if err := os.MkdirAll(log.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	if err := linkCheck(log.Dir, log.Name); err != nil {
		return nil, err
	}
	logPath := log.Path()
	attr := &syscall.SysProcAttr{Setsid: true}
	makeIt := s.Home != "" // a passwd home is the user's, never made here
	if s.User != "" {
		cred, home, err := credential(s.User)
		if err != nil {
			return nil, err
		}
		if int(cred.Uid) != os.Geteuid() {
			attr.Credential = cred
		}
		if s.Home == "" {
			s.Home = home
		}
	}
	if makeIt {
		if err := makeHome(s.Home, attr.Credential); err != nil {
			return nil, err
		}
	}
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o640)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%w: %s", ErrLogExists, logPath)
	}
	if err != nil {
		return nil, fmt.Errorf("create log: %w", err)
	}
	defer f.Close()
	if attr.Credential != nil {
		_ = f.Chown(int(attr.Credential.Uid), int(attr.Credential.Gid))
	}
	if systemdRuns() { // systemd_unit.go
		if st, err := h.startInUnit(ctx, s, log, f); !errors.Is(err, errNoUnit) {
			return st, err
		}
	}
	cmd := exec.Command(s.Argv[0], s.Argv[1:]...)
	cmd.Args = s.Argv
	cmd.Env = s.Environ()
	cmd.Dir = s.Workdir
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.Stdout, cmd.Stderr = f, f // the file itself: no pipe, no goroutine of ours in between
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(f, "agent: could not start %q: %v\n", s.Argv[0], err)
		return nil, fmt.Errorf("start %s: %w", strconv.Quote(s.Argv[0]), err)
	}
	pid := cmd.Process.Pid
	// Not yet waited for, so the entry is there even if it already exited (a zombie).
	st, err := h.Proc.Stat(pid)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("start: read the new process: %w", err)
	}
	exited := make(chan struct{})
	var mu sync.Mutex
	status := ""
	go func() {
		// Reap it, so its exit shows at once (and no zombie of ours is left); the
		// process itself does not depend on this goroutine or on the agent.
		err := cmd.Wait()
		mu.Lock()
		if cmd.ProcessState != nil {
			status = cmd.ProcessState.String()
		} else if err != nil {
			status = err.Error()
		}
		mu.Unlock()
		close(exited)
	}()
	started := &Started{
		ID: st.Identity(), PGID: st.PGRP, SID: st.Session, Exited: exited,
		ExitStatus: func() string { mu.Lock(); defer mu.Unlock(); return status },
	}
	if err := linkCurrent(log.Dir, log.Name, log.Generation); err != nil {
		return started, err // checked above; a race with the operator
	}
	_ = pruneLogs(log.Dir, log.Name, log.Keep, log.Generation)
	return started, nil
}

// makeHome makes a missing home directory, owned by cred (nil: the agent's user). An
// existing one is left as it is: the operator may have prepared it.
func makeHome(home string, cred *syscall.Credential) error {
	if home == "" {
		return nil
	}
	if _, err := os.Stat(home); err == nil {
		return nil
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return fmt.Errorf("home %s: %w", home, err)
	}
	if cred != nil {
		if err := os.Chown(home, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("home %s: %w", home, err)
		}
	}
	return nil
}

// credential returns the user's uid and gid, and its home directory from passwd.
func credential(name string) (*syscall.Credential, string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, nerr := strconv.Atoi(name); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("user %q: %w", name, err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, u.HomeDir, nil
}
