package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"
)

// DefaultRoot is where procfs is mounted on the hosts.
const DefaultRoot = "/proc"

// ClockTicks is USER_HZ, the unit of StartTicks. It is 100 on every Linux
// architecture the agent runs on (the kernel exports it so, whatever HZ is).
const ClockTicks = 100

// ErrNoProcess is wrapped when a PID has no entry under the root: it never
// existed or it has exited and been reaped.
var ErrNoProcess = errors.New("no such process")

// FS reads process facts under Root. The zero value reads DefaultRoot.
// It holds no state, so one value may be shared freely.
type FS struct {
	// Root is the procfs mount point; empty means DefaultRoot. Tests point
	// it at fake trees.
	Root string
}

func (fs FS) root() string {
	if fs.Root == "" {
		return DefaultRoot
	}
	return fs.Root
}

func (fs FS) path(elem ...string) string {
	return filepath.Join(append([]string{fs.root()}, elem...)...)
}

func (fs FS) pidPath(pid int, elem ...string) string {
	return fs.path(append([]string{strconv.Itoa(pid)}, elem...)...)
}

// gone reports whether err means the process is not there (any more).
// ESRCH is what procfs returns for a process that exits while being read.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// readPID reads a per-process file, mapping a vanished process to
// ErrNoProcess.
func (fs FS) readPID(pid int, name string) ([]byte, error) {
	b, err := os.ReadFile(fs.pidPath(pid, name))
	if err != nil {
		if gone(err) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	return b, nil
}

// Stat reads and parses /proc/PID/stat.
func (fs FS) Stat(pid int) (Stat, error) {
	b, err := fs.readPID(pid, "stat")
	if err != nil {
		return Stat{}, err
	}
	s, err := ParseStat(b)
	if err != nil {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return s, nil
}

// Cmdline returns the argv of pid, read from /proc/PID/cmdline. A kernel
// thread or a zombie has an empty one. A process may rewrite its own argv
// area, so this is what the process shows, which the agent compares against
// what it launched rather than trusting it alone.
func (fs FS) Cmdline(pid int) ([]string, error) {
	b, err := fs.readPID(pid, "cmdline")
	if err != nil {
		return nil, err
	}
	return splitNUL(b), nil
}

// Environ returns the environment of pid as KEY=VALUE entries, read from
// /proc/PID/environ. It is the environment at exec time; later setenv calls
// of the process do not show.
func (fs FS) Environ(pid int) ([]string, error) {
	b, err := fs.readPID(pid, "environ")
	if err != nil {
		return nil, err
	}
	return splitNUL(b), nil
}

// Cwd returns the working directory of pid (the /proc/PID/cwd link).
func (fs FS) Cwd(pid int) (string, error) {
	s, err := os.Readlink(fs.pidPath(pid, "cwd"))
	if err != nil {
		if gone(err) {
			return "", fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return "", fmt.Errorf("pid %d: %w", pid, err)
	}
	return s, nil
}

func splitNUL(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	parts := bytes.Split(b, []byte{0})
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = string(p)
	}
	return out
}

// BootTime returns the boot time from the btime line of /proc/stat.
func (fs FS) BootTime() (time.Time, error) {
	f, err := os.Open(fs.path("stat"))
	if err != nil {
		return time.Time{}, fmt.Errorf("boot time: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := bytes.CutPrefix(sc.Bytes(), []byte("btime "))
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil || n < 0 {
			return time.Time{}, fmt.Errorf("boot time: bad btime %q", v)
		}
		return time.Unix(n, 0), nil
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, fmt.Errorf("boot time: %w", err)
	}
	return time.Time{}, fmt.Errorf("boot time: no btime line in %s", fs.path("stat"))
}

// StartTime converts start ticks to wall-clock time given the boot time.
// It is for display (status shows when a server started); identity compares
// ticks, which do not move when the wall clock is adjusted.
func StartTime(boot time.Time, ticks uint64) time.Time {
	sec := ticks / ClockTicks
	frac := ticks % ClockTicks
	return boot.Add(time.Duration(sec)*time.Second + time.Duration(frac)*(time.Second/ClockTicks))
}

// StartTime returns when pid started, in wall-clock time.
func (fs FS) StartTime(pid int) (time.Time, error) {
	s, err := fs.Stat(pid)
	if err != nil {
		return time.Time{}, err
	}
	boot, err := fs.BootTime()
	if err != nil {
		return time.Time{}, err
	}
	return StartTime(boot, s.StartTicks), nil
}

// All returns the stat of every process under the root, in PID order.
// Processes that exit during the scan are skipped; a stat line that cannot
// be parsed is an error, since silently skipping it could hide a process the
// agent must kill.
func (fs FS) All() ([]Stat, error) {
	entries, err := os.ReadDir(fs.root())
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []Stat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		s, err := fs.Stat(pid)
		if errors.Is(err, ErrNoProcess) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list processes: %w", err)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Stat) int { return a.PID - b.PID })
	return out, nil
}

// Group returns the processes whose process group is pgid.
func (fs FS) Group(pgid int) ([]Stat, error) {
	all, err := fs.All()
	if err != nil {
		return nil, err
	}
	return filter(all, func(s Stat) bool { return s.PGRP == pgid }), nil
}

// Session returns the processes whose session is sid.
func (fs FS) Session(sid int) ([]Stat, error) {
	all, err := fs.All()
	if err != nil {
		return nil, err
	}
	return filter(all, func(s Stat) bool { return s.Session == sid }), nil
}

// Descendants returns every process below pid in the parent tree (not pid
// itself), from one scan so the tree is consistent.
func (fs FS) Descendants(pid int) ([]Stat, error) {
	all, err := fs.All()
	if err != nil {
		return nil, err
	}
	return Descendants(all, pid), nil
}

// Descendants returns the processes of all that descend from any of roots
// by ppid, excluding the roots themselves, in PID order.
func Descendants(all []Stat, roots ...int) []Stat {
	children := make(map[int][]Stat)
	for _, s := range all {
		if s.PID != s.PPID { // a loop in a fake tree must not hang us
			children[s.PPID] = append(children[s.PPID], s)
		}
	}
	seen := make(map[int]bool)
	for _, r := range roots {
		seen[r] = true
	}
	var out []Stat
	queue := slices.Clone(roots)
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if seen[c.PID] {
				continue
			}
			seen[c.PID] = true
			out = append(out, c)
			queue = append(queue, c.PID)
		}
	}
	slices.SortFunc(out, func(a, b Stat) int { return a.PID - b.PID })
	return out
}

func filter(all []Stat, keep func(Stat) bool) []Stat {
	var out []Stat
	for _, s := range all {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// NSpid returns the PIDs of pid in each PID namespace it belongs to, from the
// root's own (the first) to its innermost (the last): the NSpid line of
// /proc/PID/status. A process in an Incus container has two: the host's PID
// and the container's.
func (fs FS) NSpid(pid int) ([]int, error) {
	b, err := fs.readPID(pid, "status")
	if err != nil {
		return nil, err
	}
	return parseNSpid(b, pid)
}

func parseNSpid(status []byte, pid int) ([]int, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		v, ok := bytes.CutPrefix(sc.Bytes(), []byte("NSpid:"))
		if !ok {
			continue
		}
		fields := bytes.Fields(v)
		if len(fields) == 0 {
			break
		}
		out := make([]int, len(fields))
		for i, f := range fields {
			n, err := strconv.Atoi(string(f))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("pid %d: bad NSpid line %q", pid, v)
			}
			out[i] = n
		}
		return out, nil
	}
	return nil, fmt.Errorf("pid %d: no NSpid line in status (kernel older than 4.1?)", pid)
}

// PIDNamespace returns the PID namespace of pid as the kernel names it
// ("pid:[4026531836]"), the /proc/PID/ns/pid link.
func (fs FS) PIDNamespace(pid int) (string, error) {
	s, err := os.Readlink(fs.pidPath(pid, "ns", "pid"))
	if err != nil {
		if gone(err) {
			return "", fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return "", fmt.Errorf("pid %d: %w", pid, err)
	}
	return s, nil
}

// ErrNotInNamespace is wrapped when no process has the asked PID in a namespace.
var ErrNotInNamespace = errors.New("no process with that pid in the namespace")

// PIDIn returns the PID under the root of the process that is nsPID in the PID
// namespace of process ref (an Incus container's init): the process in ref's
// namespace whose innermost NSpid entry is nsPID. Processes that exit during
// the scan are skipped.
func (fs FS) PIDIn(ref, nsPID int) (int, error) {
	ns, err := fs.PIDNamespace(ref)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir(fs.root())
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if other, err := fs.PIDNamespace(pid); err != nil || other != ns {
			continue
		}
		ids, err := fs.NSpid(pid)
		if err == nil && ids[len(ids)-1] == nsPID {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("pid %d in the namespace %s of pid %d: %w", nsPID, ns, ref, ErrNotInNamespace)
}
