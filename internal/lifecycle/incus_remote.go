package lifecycle

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/proc"
)

// An instance on another cluster member runs its processes in a kernel the agent
// cannot read: the init PID Incus reports is that member's, and this host's /proc
// knows nothing of it. There the Incus place works through the Incus API only
// (remote mode): every observation is an exec of a small busybox-compatible script
// that reads the instance's own /proc, every signal an exec of kill, and the log files
// come through the file API. PIDs are then the container's own, so a record must say
// which PID namespace its PID belongs to (Started.NS): the instance's namespace is
// named by the kernel's boot_id and its init's start time, both read inside, which
// change when the member reboots or the container restarts, and a PID recorded in
// one namespace is never looked up in another (it reads as gone there).

// nsScript prints the first line of every remote script's output: "ns BOOT_ID/TICKS",
// the identity of the instance's PID namespace (see Namespace). It defines startTicks,
// which prints field 22 of a stat line given as words after the ") " ending its comm.
const nsScript = `startTicks() { shift 19; echo "$1"; }
{ read -r b </proc/sys/kernel/random/boot_id && read -r s </proc/1/stat; } || exit 90
printf 'ns %s/' "$b"
startTicks ${s##*) }
`

// exitNoProcess is a remote script's exit code for a PID with no entry.
const exitNoProcess = 3

// readScript prints /proc/$1/$2 (or where the link $2 points with $3 = link).
const readScript = nsScript + `f=/proc/$1/$2
if [ "$3" = link ]; then readlink "$f" || exit 3; exit 0; fi
[ -e "$f" ] || exit 3
cat "$f" || exit 3
`

// listScript prints "S <stat line>" for every process, and "M <pid>" for each whose
// environment holds the exact entry $1 (when $1 is not empty).
const listScript = nsScript + `m=$1
for d in /proc/[0-9]*; do
  { read -r s <"$d/stat"; } 2>/dev/null || continue
  echo "S $s"
  if [ -n "$m" ] && tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qxF -- "$m"; then echo "M ${d#/proc/}"; fi
done
`

// signalScript sends signal $1 (a number) to process group $2 (0: none) once one of
// its members is verified alive as itself, then to each process named by a word
// PID:TICKS:G that is still that process (G "g": a group member, already reached by
// the group signal). It prints "group PGID" and "sent PID" for what it signalled.
const signalScript = nsScript + `sig=$1 pgid=$2
shift 2
alive() { { read -r s </proc/$1/stat; } 2>/dev/null || return 1; [ "$(startTicks ${s##*) })" = "$2" ]; }
gsent=
for x in "$@"; do
  [ "$pgid" != 0 ] && [ -z "$gsent" ] || break
  p=${x%%:*} r=${x#*:}; t=${r%%:*} g=${r#*:}
  if [ "$g" = g ] && alive "$p" "$t"; then kill -"$sig" -"$pgid" 2>/dev/null && gsent=1 && echo "group $pgid"; fi
done
for x in "$@"; do
  p=${x%%:*} r=${x#*:}; t=${r%%:*} g=${r#*:}
  if [ "$g" = g ] && [ -n "$gsent" ]; then continue; fi
  if alive "$p" "$t"; then kill -"$sig" "$p" 2>/dev/null && echo "sent $p"; fi
done
exit 0
`

// portScript prints the instance's TCP tables and every process's descriptors.
const portScript = nsScript + `echo @@tcp; cat /proc/net/tcp
echo @@tcp6; cat /proc/net/tcp6 2>/dev/null
echo @@fd; ls -l /proc/[0-9]*/fd 2>/dev/null
exit 0
`

// remoteResult is the output of a remote script after its namespace line.
type remoteResult struct {
	ns   string
	out  []byte
	code int
}

// sh runs a remote script inside the instance as root and splits off its namespace
// line. An exit code other than 0 and exitNoProcess is an error naming stderr.
func (r *Incus) sh(ctx context.Context, script, name string, args ...string) (remoteResult, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout())
		defer cancel()
	}
	argv := append([]string{"/bin/sh", "-c", script, name}, args...)
	res, err := r.Client.Exec(ctx, r.Instance, incus.ExecRequest{Command: argv, Cwd: "/"})
	if err != nil {
		if incus.IsNotFound(err) {
			return remoteResult{}, fmt.Errorf("container %s does not exist: %w", r.Instance, ErrNotRunning)
		}
		return remoteResult{}, fmt.Errorf("container %s: %s: %w", r.Instance, name, err)
	}
	ns, out, ok := parseNSLine(res.Stdout)
	if !ok || (res.ExitCode != 0 && res.ExitCode != exitNoProcess) {
		return remoteResult{}, fmt.Errorf("container %s: %s exited %d: %s", r.Instance, name, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return remoteResult{ns: ns, out: out, code: res.ExitCode}, nil
}

// parseNSLine splits "ns BOOT/TICKS\n" off a remote script's output.
func parseNSLine(b []byte) (ns string, rest []byte, ok bool) {
	line, rest, found := bytes.Cut(b, []byte("\n"))
	id, isNS := strings.CutPrefix(string(line), "ns ")
	if !found || !isNS {
		return "", nil, false
	}
	boot, ticks, _ := strings.Cut(id, "/")
	if boot == "" || ticks == "" {
		return "", nil, false
	}
	if _, err := strconv.ParseUint(ticks, 10, 64); err != nil {
		return "", nil, false
	}
	return id, rest, true
}

// Namespace returns the identity of the instance's PID namespace as a remote
// observation names it (Started.NS): the boot_id of the kernel it runs on and its init's
// start time, read inside. It wraps ErrNotRunning when the instance does not run.
func (r *Incus) Namespace(ctx context.Context) (string, error) {
	res, err := r.sh(ctx, nsScript, "agent-ns")
	if err != nil {
		return "", r.notRunning(ctx, err)
	}
	return res.ns, nil
}

// notRunning turns a failed exec into ErrNotRunning when the instance is not running
// (an exec fails then), keeping err otherwise.
func (r *Incus) notRunning(ctx context.Context, err error) error {
	if errors.Is(err, ErrNotRunning) {
		return err
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout())
	defer cancel()
	st, serr := r.Client.InstanceState(qctx, r.Instance)
	if incus.IsNotFound(serr) {
		return fmt.Errorf("container %s does not exist: %w", r.Instance, ErrNotRunning)
	}
	if serr == nil && st.StatusCode != incus.StatusRunning {
		return fmt.Errorf("container %s is %s: %w", r.Instance, strings.ToLower(st.Status), ErrNotRunning)
	}
	return err
}

// remoteProcs observes and stops the processes of an instance through exec. PIDs are
// the instance's own, in the namespace ns: when the instance's namespace is another
// (it restarted, or it is stopped), every process reads as gone. ns "" takes the
// namespace found at each call (only for the port questions, which are the instance's
// whatever its namespace).
type remoteProcs struct {
	r  *Incus
	ns string
	// poll is how often a stop looks again (remotePoll when zero).
	poll time.Duration
}

// remotePoll is how often a remote stop or port wait looks again: each look is an
// exec, a few round trips through the cluster.
const remotePoll = 200 * time.Millisecond

var _ Procs = remoteProcs{}

// NS is the namespace the PIDs belong to.
func (p remoteProcs) NS() string { return p.ns }

// bound is ctx bounded by the place's timeout for one look.
func (p remoteProcs) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.r.timeout())
}

// read reads /proc/PID/NAME inside; ErrNoProcess when it has no entry, or when the
// namespace is not p's.
func (p remoteProcs) read(ctx context.Context, pid int, name string, link bool) ([]byte, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", pid, proc.ErrNoProcess)
	}
	ctx, cancel := p.bound(ctx)
	defer cancel()
	mode := ""
	if link {
		mode = "link"
	}
	res, err := p.r.sh(ctx, readScript, "agent-read", strconv.Itoa(pid), name, mode)
	if err != nil {
		if errors.Is(p.r.notRunning(ctx, err), ErrNotRunning) {
			return nil, fmt.Errorf("pid %d in container %s: %w (the container does not run)", pid, p.r.Instance, proc.ErrNoProcess)
		}
		return nil, err
	}
	if p.ns != "" && res.ns != p.ns {
		return nil, fmt.Errorf("pid %d in container %s: %w (the container restarted since)", pid, p.r.Instance, proc.ErrNoProcess)
	}
	if res.code == exitNoProcess {
		return nil, fmt.Errorf("pid %d in container %s: %w", pid, p.r.Instance, proc.ErrNoProcess)
	}
	return res.out, nil
}

func (p remoteProcs) Stat(ctx context.Context, pid int) (proc.Stat, error) {
	b, err := p.read(ctx, pid, "stat", false)
	if err != nil {
		return proc.Stat{}, err
	}
	return proc.ParseStat(b)
}

func (p remoteProcs) Alive(ctx context.Context, id proc.Identity) (bool, error) {
	st, err := p.Stat(ctx, id.PID)
	if errors.Is(err, proc.ErrNoProcess) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.StartTicks == id.StartTicks && !st.Dead(), nil
}

func (p remoteProcs) Cmdline(ctx context.Context, pid int) ([]string, error) {
	b, err := p.read(ctx, pid, "cmdline", false)
	if err != nil {
		return nil, err
	}
	return splitNUL(b), nil
}

func (p remoteProcs) Environ(ctx context.Context, pid int) ([]string, error) {
	b, err := p.read(ctx, pid, "environ", false)
	if err != nil {
		return nil, err
	}
	return splitNUL(b), nil
}

func (p remoteProcs) Cwd(ctx context.Context, pid int) (string, error) {
	b, err := p.read(ctx, pid, "cwd", true)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

func (p remoteProcs) UIDs(ctx context.Context, pid int) (real, effective uint32, err error) {
	b, err := p.read(ctx, pid, "status", false)
	if err != nil {
		return 0, 0, err
	}
	return parseUIDs(b)
}

// BootTime is the boot time of the kernel the instance runs on (/proc/stat's btime
// read inside): StartTicks count from it.
func (p remoteProcs) BootTime(ctx context.Context) (time.Time, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	res, err := p.r.sh(ctx, nsScript+`cat /proc/stat`, "agent-btime")
	if err != nil {
		return time.Time{}, err
	}
	return parseBtime(res.out)
}

// All lists the instance's processes, and those whose environment holds marker.
func (p remoteProcs) all(ctx context.Context, marker string) ([]proc.Stat, map[int]bool, error) {
	res, err := p.r.sh(ctx, listScript, "agent-ps", marker)
	if err != nil {
		if errors.Is(p.r.notRunning(ctx, err), ErrNotRunning) {
			return nil, nil, nil // a stopped instance runs nothing
		}
		return nil, nil, err
	}
	if p.ns != "" && res.ns != p.ns {
		return nil, nil, nil // the namespace of these PIDs is gone, and all in it
	}
	all, marked := parseList(res.out)
	return all, marked, nil
}

func (p remoteProcs) PortOwners(ctx context.Context, port int) ([]int, error) {
	ctx, cancel := p.bound(ctx)
	defer cancel()
	owners, _, err := p.portOwners(ctx, port)
	return owners, err
}

// portOwners returns the PIDs holding a socket listening on port inside, and whether
// any listener is there (also one whose owner is not visible).
func (p remoteProcs) portOwners(ctx context.Context, port int) ([]int, bool, error) {
	res, err := p.r.sh(ctx, portScript, "agent-ports")
	if err != nil {
		if errors.Is(p.r.notRunning(ctx, err), ErrNotRunning) {
			return nil, false, nil // a stopped instance holds no port
		}
		return nil, false, err
	}
	return parsePortOwners(res.out, port)
}

func (p remoteProcs) PortFree(ctx context.Context, port int, wait time.Duration) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d: out of range", port)
	}
	deadline := time.Now().Add(wait)
	for {
		owners, held, err := p.portOwners(ctx, port)
		if err == nil && !held {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if err != nil {
				return fmt.Errorf("port %d in container %s: %w", port, p.r.Instance, err)
			}
			who := "owner not visible"
			if len(owners) > 0 {
				who = p.describe(ctx, owners)
			}
			return fmt.Errorf("port %d in container %s: %w after %s: %s", port, p.r.Instance, proc.ErrPortHeld, wait, who)
		}
		select {
		case <-ctx.Done():
		case <-time.After(p.interval()):
		}
	}
}

func (p remoteProcs) interval() time.Duration {
	if p.poll > 0 {
		return p.poll
	}
	return remotePoll
}

// describe names processes with their command lines, for errors.
func (p remoteProcs) describe(ctx context.Context, pids []int) string {
	parts := make([]string, 0, len(pids))
	for _, pid := range pids {
		d := "pid " + strconv.Itoa(pid)
		if argv, err := p.Cmdline(ctx, pid); err == nil && len(argv) > 0 {
			d += " " + strconv.Quote(strings.Join(argv, " "))
		}
		parts = append(parts, d)
	}
	return strings.Join(parts, "; ")
}

// splitNUL splits a NUL-separated /proc file (cmdline, environ).
func splitNUL(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}

// parseUIDs reads the real and effective uid from a /proc/PID/status file.
func parseUIDs(b []byte) (real, effective uint32, err error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Uid:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		r, rerr := strconv.ParseUint(f[0], 10, 32)
		e, eerr := strconv.ParseUint(f[1], 10, 32)
		if rerr != nil || eerr != nil {
			break
		}
		return uint32(r), uint32(e), nil
	}
	return 0, 0, errors.New("status: no Uid line")
}

// parseBtime reads btime from /proc/stat.
func parseBtime(b []byte) (time.Time, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "btime "); ok {
			s, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("/proc/stat: bad btime %q", rest)
			}
			return time.Unix(s, 0), nil
		}
	}
	return time.Time{}, errors.New("/proc/stat: no btime line")
}

// parseList reads listScript's output: the stat of every process (lines that do not
// parse, a process caught half-gone, are skipped) and the PIDs carrying the marker.
func parseList(b []byte) ([]proc.Stat, map[int]bool) {
	var all []proc.Stat
	marked := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if s, ok := strings.CutPrefix(line, "S "); ok {
			if st, err := proc.ParseStat([]byte(s)); err == nil {
				all = append(all, st)
			}
		} else if s, ok := strings.CutPrefix(line, "M "); ok {
			if pid, err := strconv.Atoi(s); err == nil {
				marked[pid] = true
			}
		}
	}
	return all, marked
}

// parsePortOwners reads portScript's output: the listening inodes on port from both
// tables, matched against the socket:[inode] links of `ls -l /proc/[0-9]*/fd` (busybox
// and coreutils both print "/proc/PID/fd:" before each directory and "NAME -> TARGET"
// for each link). held is true when some socket listens on port, owned or not.
func parsePortOwners(b []byte, port int) (owners []int, held bool, err error) {
	sections := map[string][]byte{}
	cur := ""
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		if s, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("@@")); ok && len(s) > 0 && !bytes.ContainsAny(s, " \t") {
			cur = string(s)
			continue
		}
		sections[cur] = append(sections[cur], line...)
	}
	want := map[string]bool{}
	for _, table := range []string{"tcp", "tcp6"} {
		if len(sections[table]) == 0 {
			continue
		}
		inodes, err := proc.ParseListening(bytes.NewReader(sections[table]), port)
		if err != nil {
			return nil, false, fmt.Errorf("listening sockets: %s: %w", table, err)
		}
		for _, ino := range inodes {
			want["socket:["+strconv.FormatUint(ino, 10)+"]"] = true
		}
	}
	if len(want) == 0 {
		return nil, false, nil
	}
	pid := 0
	seen := map[int]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sections["fd"]))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if dir, ok := strings.CutSuffix(line, ":"); ok && strings.HasPrefix(dir, "/proc/") {
			n, perr := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(dir, "/proc/"), "/fd"))
			pid = 0
			if perr == nil {
				pid = n
			}
			continue
		}
		_, target, ok := strings.Cut(line, " -> ")
		if ok && pid > 0 && want[strings.TrimSpace(target)] && !seen[pid] {
			seen[pid] = true
			owners = append(owners, pid)
		}
	}
	return owners, true, nil
}
