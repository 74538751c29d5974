package lifecycle

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/proc"
)

// Incus runs servers inside an Incus instance (a system container), reached through
// the Incus REST API, with everything of the host's lifecycle:
//
//   - Start runs one exec (two with a user) that creates the log directory and the
//     generation's file with the shell's noclobber (never an old log reused), points
//     <name>.log at it, and starts the server with setsid(1), all descriptors
//     redirected, so the exec operation ends at once and the server is re-parented to
//     the container's init: restarting the agent or incusd never stops it. The server
//     stops itself (SIGSTOP) before exec'ing the declared argv; the agent finds it in
//     the host's /proc (the PID from $! mapped with NSpid, proved by its command line),
//     records its host PID and start time, and only then lets it run (SIGCONT). So
//     even a server that dies at once is known by identity, and nothing runs unrecorded.
//     Words reach the instance as exec arguments, never through a shell's parsing.
//   - Processes are observed and stopped in the host's /proc with host PIDs: stat,
//     argv, environment and the group kill work unchanged. Ports are looked up in the
//     container's network namespace (/proc/<init>/net/tcp{,6}).
//   - Logs are read through /proc/<init>/root: the record keeps the in-container
//     path, mapped at each use, since the init PID changes when the container restarts.
//   - The agent reaches the server's port through Endpoints: a proxy device of the
//     instance, or its global address (IncusEndpoint).
//
// That is for an instance on this host. One on another cluster member is reached
// through the Incus API only (remote mode, incus_remote.go): the same launch, with its
// processes observed and stopped inside by exec and its logs read through the file API.
//
// A zero Incus is not usable: set Client and Instance. It caches the instance's init
// process (verified alive by PID and start time at each use); use one value per run.
type Incus struct {
	Client   *incus.Client
	Instance string
	// Proc reads the host's /proc; the zero value reads the real one.
	Proc proc.FS
	// Endpoints maps ports inside the instance to the host:port where the agent
	// reaches them (IncusEndpoint).
	Endpoints map[int]string
	// Timeout bounds each Incus request made without a deadline (10 s when zero).
	Timeout time.Duration
	// Remote makes the place work through the Incus API only, as it does for an
	// instance on another cluster member (incus_remote.go), also for one on this
	// host: the test cluster's members share one host. Left false, the place decides
	// per instance.
	Remote bool

	mu     sync.Mutex
	init   proc.Identity
	mode   int                  // modeLocal, modeRemote; 0: not decided yet
	pulled map[string]time.Time // remote mode: when each file was last copied
}

var _ Place = (*Incus)(nil)

// ErrNotRunning is wrapped when the instance is not running.
var ErrNotRunning = errors.New("container is not running")

// Name is "container NAME".
func (r *Incus) Name() string { return IncusPlace(r.Instance) }

// IncusPlace is the place of servers in the instance name.
func IncusPlace(name string) string { return "container " + name }

// Endpoint is the address from Endpoints; "" when the port is not reachable.
func (r *Incus) Endpoint(port int) string { return r.Endpoints[port] }

// Procs is what a launch of now is observed and stopped with: the host's /proc, with
// ports looked up in the instance's network namespace; in remote mode, the instance's
// own /proc through exec, in whatever namespace it has at each look. A record's PIDs
// are read with ProcsIn(its namespace).
func (r *Incus) Procs(ctx context.Context) Procs {
	if remote, err := r.remote(ctx); err == nil && remote {
		return remoteProcs{r: r}
	}
	return incusProcs{hostProcs: hostProcs{r.Proc}, r: r}
}

func (r *Incus) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return 10 * time.Second
}

// Init returns the instance's init process, in the host's PID namespace. It wraps
// ErrNotRunning when the instance is stopped or does not exist.
func (r *Incus) Init(ctx context.Context) (proc.Identity, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.init.PID > 0 {
		if ok, err := r.Proc.Alive(r.init); err == nil && ok {
			return r.init, nil
		}
		r.init = proc.Identity{}
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout())
	defer cancel()
	st, err := r.Client.InstanceState(ctx, r.Instance)
	if incus.IsNotFound(err) {
		// A deleted instance runs nothing and holds no port: stopping a server that
		// lived in it is done, not an error that no apply could ever get past.
		return proc.Identity{}, fmt.Errorf("container %s does not exist: %w", r.Instance, ErrNotRunning)
	}
	if err != nil {
		return proc.Identity{}, fmt.Errorf("container %s: %w", r.Instance, err)
	}
	if st.StatusCode != incus.StatusRunning || st.Pid <= 0 {
		return proc.Identity{}, fmt.Errorf("container %s is %s: %w", r.Instance, strings.ToLower(st.Status), ErrNotRunning)
	}
	id, err := r.Proc.Identify(int(st.Pid))
	if err != nil {
		return proc.Identity{}, fmt.Errorf("container %s: its init pid %d: %w", r.Instance, st.Pid, err)
	}
	if err := r.checkInit(id.PID); err != nil {
		return proc.Identity{}, err
	}
	r.init = id
	return id, nil
}

func (r *Incus) procRoot() string {
	if r.Proc.Root != "" {
		return r.Proc.Root
	}
	return proc.DefaultRoot
}

// HostPath is /proc/<init>/root/<path>: the file as the instance sees it.
//
// Symlinks inside are resolved by the host's kernel from that directory: a relative
// link stays inside, an absolute one resolves against the host's root. The agent's
// own links (<name>.log) are relative.
//
// In remote mode it is a copy of the file, pulled through the Incus file API at the
// call (see mirror): a reader of a growing log asks again for each look.
func (r *Incus) HostPath(ctx context.Context, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("container %s: %q is not an absolute path", r.Instance, p)
	}
	remote, err := r.remote(ctx)
	if err != nil && !incus.IsNotFound(err) {
		return "", err
	}
	if remote {
		return r.mirror(ctx, p)
	}
	init, err := r.Init(ctx)
	if err != nil {
		return "", err
	}
	return r.procRoot() + "/" + strconv.Itoa(init.PID) + "/root" + path.Clean(p), nil
}

// Exit codes of the launch scripts.
const (
	exitLogExists  = 17
	exitWorkdir    = 18
	exitLogDir     = 20
	exitLinkNotSym = 21
	exitChown      = 22
	exitLink       = 23
	exitLogCreate  = 24
)

// prepareScript makes the log directory and the generation's log (noclobber: an
// existing file is never reused) and points <name>.log at it. Arguments: dir, name,
// generation, owner ("" or "uid:gid").
const prepareScript = `dir=$1 name=$2 gen=$3 owner=$4
shift 4
log="$dir/$name.$gen.log"
cur="$dir/$name.log"
mkdir -p -- "$dir" || exit 20
if [ -e "$cur" ] && [ ! -L "$cur" ]; then exit 21; fi
set -C
: >"$log" || { [ -e "$log" ] && exit 17; exit 24; }
set +C
if [ -n "$owner" ]; then chown -- "$owner" "$log" || exit 22; fi
tmp="$dir/.$name.log.tmp$$"
rm -f -- "$tmp"
ln -s -- "$name.$gen.log" "$tmp" && mv -f -- "$tmp" "$cur" || exit 23
`

// launchScript starts the server detached: a session of its own (setsid), stdin from
// /dev/null, stdout and stderr appended to its log, then prints its PID. The server
// stops itself before exec'ing the command, until the agent has recorded it.
// Arguments: log, workdir, tag (the stopped shell's $0), then the command.
const launchScript = `log=$1 wd=$2 tag=$3
shift 3
cd -- "$wd" 2>>"$log" || { msg="agent: could not enter the working directory $wd"; echo "$msg" >>"$log"; echo "$msg" >&2; exit 18; }
setsid sh -c 'kill -STOP $$ && exec "$@"' "$tag" "$@" </dev/null >>"$log" 2>&1 &
echo "$!"
`

// stoppedScript is the inner shell's script, as its command line shows it.
const stoppedScript = `kill -STOP $$ && exec "$@"`

// DefaultPath is the PATH of a server inside a container, unless declared, and on the
// host when the agent itself has none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Start launches s inside the instance; see Incus.
func (r *Incus) Start(ctx context.Context, s Spec, log LogFile) (*Started, error) {
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return nil, errors.New("start: empty command")
	}
	if strings.Contains(s.Argv[0], "=") {
		return nil, fmt.Errorf("start: the program %q contains '=': env(1) would take it for a variable", s.Argv[0])
	}
	if !path.IsAbs(log.Dir) {
		return nil, fmt.Errorf("start: log dir %q is not absolute", log.Dir)
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("start: bad environment variable name %q", k)
		}
	}
	remote, err := r.remote(ctx)
	if err != nil {
		return nil, fmt.Errorf("start: %w", r.notRunning(ctx, err))
	}
	var init proc.Identity
	if !remote {
		if init, err = r.Init(ctx); err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
	}
	home, uid, gid := "/root", uint32(0), uint32(0)
	if s.User != "" {
		if uid, gid, home, err = r.lookupUser(ctx, s.User); err != nil {
			return nil, fmt.Errorf("start: %w", err)
		}
	}
	workdir := s.Workdir
	if workdir == "" {
		workdir = "/"
	}
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	tag := "agent-launch-" + hex.EncodeToString(nonce[:])
	command := append([]string{"env", "-i", "--"}, r.environ(s, home)...)
	command = append(command, s.Argv...)

	owner := ""
	if uid != 0 || gid != 0 {
		owner = fmt.Sprintf("%d:%d", uid, gid)
	}
	prepareArgs := []string{log.Dir, log.Name, strconv.Itoa(log.Generation), owner}
	launchArgs := append([]string{log.Path(), workdir, tag}, command...)
	var res *incus.ExecResult
	if owner == "" {
		argv := append([]string{"/bin/sh", "-c", prepareScript + launchScript, "agent-launch"}, prepareArgs...)
		res, err = r.exec(ctx, incus.ExecRequest{Command: append(argv, launchArgs...)}, log)
	} else {
		argv := append([]string{"/bin/sh", "-c", prepareScript, "agent-prepare"}, prepareArgs...)
		if res, err = r.exec(ctx, incus.ExecRequest{Command: argv}, log); err == nil {
			argv = append([]string{"/bin/sh", "-c", launchScript, "agent-launch"}, launchArgs...)
			res, err = r.exec(ctx, incus.ExecRequest{Command: argv, User: uid, Group: gid, Cwd: "/"}, log)
		}
	}
	if err != nil {
		return nil, err
	}
	nsPID, err := strconv.Atoi(strings.TrimSpace(lastLine(res.Stdout)))
	if err != nil || nsPID <= 0 {
		return nil, fmt.Errorf("start in container %s: the launch printed %q, not a PID (stderr %q)", r.Instance, res.Stdout, res.Stderr)
	}
	if remote {
		return r.startRemote(ctx, nsPID, tag, log)
	}
	id, st, err := r.identify(ctx, init, nsPID, tag)
	if err != nil {
		if id.PID > 0 {
			_, _ = r.Proc.Signal(id, syscall.SIGKILL) // never leave a stopped, unrecorded process
		}
		return nil, fmt.Errorf("start in container %s: %w", r.Instance, err)
	}
	if sent, err := r.Proc.Signal(id, syscall.SIGCONT); err != nil || !sent {
		_, _ = r.Proc.Signal(id, syscall.SIGKILL)
		if err == nil {
			err = errors.New("it vanished while stopped")
		}
		return nil, fmt.Errorf("start in container %s: continue pid %d: %w", r.Instance, id.PID, err)
	}
	started := &Started{ID: id, PGID: st.PGRP, SID: st.Session}
	if dir, err := r.HostPath(ctx, log.Dir); err == nil {
		_ = pruneLogs(dir, log.Name, log.Keep, log.Generation)
	}
	return started, nil
}

// exec runs a launch script and maps its exit code to an error.
func (r *Incus) exec(ctx context.Context, req incus.ExecRequest, log LogFile) (*incus.ExecResult, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Minute)
		defer cancel()
	}
	res, err := r.Client.Exec(ctx, r.Instance, req)
	if err != nil {
		return nil, fmt.Errorf("start in container %s: %w", r.Instance, err)
	}
	where := " in container " + r.Instance
	stderr := strings.TrimSpace(string(res.Stderr))
	switch res.ExitCode {
	case 0:
		return res, nil
	case exitLogExists:
		return nil, fmt.Errorf("%w: %s%s", ErrLogExists, log.Path(), where)
	case exitLinkNotSym:
		return nil, fmt.Errorf("%s%s exists and is not a symlink: move it aside (the agent keeps <name>.log as a link to the current generation's log)", CurrentLink(log.Dir, log.Name), where)
	case exitLogDir:
		return nil, fmt.Errorf("log dir %s%s: cannot create it: %s", log.Dir, where, stderr)
	case exitLogCreate:
		return nil, fmt.Errorf("create log %s%s: %s", log.Path(), where, stderr)
	case exitChown, exitLink:
		return nil, fmt.Errorf("log %s%s: %s", log.Path(), where, stderr)
	case exitWorkdir:
		return nil, fmt.Errorf("start%s: %s (the log %s says so too)", where, stderr, log.Path())
	}
	return nil, fmt.Errorf("start%s: the launch script exited %d: %s", where, res.ExitCode, stderr)
}

// identify finds the launched process in the host's /proc: the PID the launch printed,
// mapped from the instance's PID namespace, whose command line is the stopped shell
// with this launch's tag, stopped, and leading its own session. When it gives up on a
// process it did find by its tag (one that never stopped), it returns that process's
// identity with the error, so that the caller kills it rather than leave it unrecorded.
func (r *Incus) identify(ctx context.Context, init proc.Identity, nsPID int, tag string) (proc.Identity, proc.Stat, error) {
	deadline := time.Now().Add(10 * time.Second)
	var why string
	var tagged proc.Stat // the launch, known by its tag, not yet as wanted
	for {
		pid, err := r.Proc.PIDIn(init.PID, nsPID)
		if err == nil {
			st, serr := r.Proc.Stat(pid)
			argv, aerr := r.Proc.Cmdline(pid)
			switch {
			case serr != nil || aerr != nil:
				why = fmt.Sprintf("pid %d (%d inside) vanished", pid, nsPID)
			case len(argv) < 4 || argv[1] != "-c" || argv[2] != stoppedScript || argv[3] != tag:
				why = fmt.Sprintf("pid %d (%d inside) runs %q, not the launch", pid, nsPID, argv)
			case st.Dead():
				return st.Identity(), st, fmt.Errorf("pid %d (%d inside) exited before it started the server", pid, nsPID)
			case st.State != 'T':
				tagged = st
				why = fmt.Sprintf("pid %d (%d inside) did not stop (state %c)", pid, nsPID, st.State)
			case st.Session != st.PID || st.PGRP != st.PID:
				return st.Identity(), st, fmt.Errorf("pid %d (%d inside) is not the leader of its session and group (setsid forked?)", pid, nsPID)
			default:
				return st.Identity(), st, nil
			}
		} else {
			why = err.Error()
		}
		if time.Now().After(deadline) {
			return tagged.Identity(), tagged, fmt.Errorf("the launched process was not found: %s", why)
		}
		select {
		case <-ctx.Done():
			return tagged.Identity(), tagged, fmt.Errorf("the launched process was not found: %s: %w", why, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// environ is the environment the server gets inside: PATH and HOME, the declared
// variables over them, sorted, then the marker. Nothing comes from the agent's own
// environment or from Incus's defaults: the identity is the declared one.
func (r *Incus) environ(s Spec, home string) []string {
	if s.Home != "" {
		home = s.Home
	}
	return s.environOver(map[string]string{"PATH": DefaultPath, "HOME": home})
}

// lookupUser resolves a user name (or a uid) in the instance's /etc/passwd.
func (r *Incus) lookupUser(ctx context.Context, name string) (uid, gid uint32, home string, err error) {
	p, err := r.HostPath(ctx, "/etc/passwd")
	if err != nil {
		return 0, 0, "", err
	}
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, 0, "", fmt.Errorf("user %q: %w", name, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 || (f[0] != name && f[2] != name) {
			continue
		}
		u, uerr := strconv.ParseUint(f[2], 10, 32)
		g, gerr := strconv.ParseUint(f[3], 10, 32)
		if uerr != nil || gerr != nil {
			continue
		}
		return uint32(u), uint32(g), f[5], nil
	}
	if u, perr := strconv.ParseUint(name, 10, 32); perr == nil {
		return uint32(u), uint32(u), "/", nil
	}
	return 0, 0, "", fmt.Errorf("user %q: not in container %s's /etc/passwd", name, r.Instance)
}

func lastLine(b []byte) string {
	s := strings.TrimRight(string(b), "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// incusProcs is the host's /proc with the port questions asked in the instance's
// network namespace. A stopped instance holds no port.
type incusProcs struct {
	hostProcs
	r *Incus
}

func (p incusProcs) PortOwners(ctx context.Context, port int) ([]int, error) {
	init, err := p.r.Init(ctx)
	if errors.Is(err, ErrNotRunning) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pids, err := p.fs.PortOwnersIn(init.PID, port)
	if errors.Is(err, proc.ErrNoProcess) {
		return nil, nil // stopped meanwhile
	}
	return pids, err
}

func (p incusProcs) PortFree(ctx context.Context, port int, wait time.Duration) error {
	init, err := p.r.Init(ctx)
	if errors.Is(err, ErrNotRunning) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := p.fs.PortFreeIn(ctx, init.PID, port, wait); err != nil {
		return fmt.Errorf("in container %s: %w", p.r.Instance, err)
	}
	return nil
}

// IncusEndpoint is where the agent reaches port of a server in the instance: the
// listen address of a proxy device (bind = host, the default) whose connect port is
// port, else the instance's first global address. It says how to add a proxy when
// there is neither.
func IncusEndpoint(inst *incus.Instance, st *incus.InstanceState, port int) (string, error) {
	names := make([]string, 0, len(inst.ExpandedDevices))
	for name := range inst.ExpandedDevices {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		dev := inst.ExpandedDevices[name]
		if dev["type"] != "proxy" || (dev["bind"] != "" && dev["bind"] != "host") {
			continue
		}
		_, _, cport, ok := proxyAddr(dev["connect"])
		if !ok || cport != strconv.Itoa(port) {
			continue
		}
		proto, host, lport, ok := proxyAddr(dev["listen"])
		if !ok || proto != "tcp" || strings.Contains(lport, "-") || strings.Contains(lport, ",") {
			continue
		}
		switch host {
		case "", "0.0.0.0":
			host = "127.0.0.1"
		case "::":
			host = "::1"
		}
		return net.JoinHostPort(host, lport), nil
	}
	if st != nil {
		nics := make([]string, 0, len(st.Network))
		for nic := range st.Network {
			nics = append(nics, nic)
		}
		slices.Sort(nics)
		for _, family := range []string{"inet", "inet6"} {
			for _, nic := range nics {
				if nic == "lo" {
					continue
				}
				for _, a := range st.Network[nic].Addresses {
					if a.Family == family && a.Scope == "global" {
						return net.JoinHostPort(a.Address, strconv.Itoa(port)), nil
					}
				}
			}
		}
	}
	return "", fmt.Errorf(`container %s has no proxy device to port %d and no global address: add one to the container block, e.g. device "api" { type = "proxy", options = { listen = "tcp:127.0.0.1:%d", connect = "tcp:127.0.0.1:%d" } }`,
		inst.Name, port, port, port)
}

// proxyAddr splits a proxy device address "tcp:127.0.0.1:8000" or "tcp:[::1]:8000".
func proxyAddr(s string) (proto, host, port string, ok bool) {
	proto, rest, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", "", false
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", "", "", false
	}
	return proto, host, port, true
}
