package testbin

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// NoLeaks makes the test prove, once it and its own clean-ups have finished, that none
// of its processes is left: a process whose HOME, working directory, or one of whose
// open files lies under one of dirs (by default the test's temporary directory, where
// its plans, state, logs and servers' homes live). Any found are SIGKILLed, with their
// process groups, and the test fails naming them. Register it first, before the
// clean-ups that stop what the test launched: clean-ups run last-registered first, so
// it then judges what they left.
//
// Why a search this wide: a clean-up that looked for servers by a HOME the test guessed
// (dir/home, where the server's default HOME is <state dir>/home) left one running after
// every suite run. A process the test launched writes under the test's directory (a log,
// a lock, a state file) or lives there; that it cannot hide.
func NoLeaks(tb testing.TB, dirs ...string) {
	tb.Helper()
	if len(dirs) == 0 {
		dirs = []string{filepath.Dir(tb.TempDir())} // the test's root: every TempDir is under it
	}
	// Once per test and directories: a helper that launches may be called many times, and
	// only the first registration runs after every clean-up registered since.
	key := fmt.Sprintf("%p %q", tb, dirs)
	if _, dup := registered.LoadOrStore(key, true); dup {
		return
	}
	tb.Cleanup(func() {
		registered.Delete(key)
		if err := KillLeft(dirs...); err != nil {
			tb.Error(err)
		}
	})
}

// leaveGrace is how long a process may take to exit after the test's own clean-up
// signalled it before it counts as left behind.
const leaveGrace = 5 * time.Second

var registered sync.Map // "tb dirs" of the NoLeaks checks registered and not yet run

// KillLeft is NoLeaks's check for harnesses that run their own scripts (testscript's
// Defer): it SIGKILLs the processes Leftovers(dirs) finds, waits until they are gone,
// and returns an error naming them, nil when none was left.
func KillLeft(dirs ...string) error {
	// A clean-up's kill is not instant: the signalled process leaves a moment later.
	left := Leftovers(dirs...)
	for deadline := time.Now().Add(leaveGrace); len(left) > 0 && time.Now().Before(deadline); left = Leftovers(dirs...) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(left) == 0 {
		return nil
	}
	var names []string
	for _, p := range left {
		names = append(names, p.String())
		syscall.Kill(-p.PID, syscall.SIGKILL) // its group, when it leads one
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if len(Leftovers(dirs...)) == 0 {
			break
		}
	}
	msg := fmt.Sprintf("processes left running at the end of the test (now killed; stop what the test started): %s", strings.Join(names, "; "))
	if still := Leftovers(dirs...); len(still) > 0 {
		msg += fmt.Sprintf("; %d survived SIGKILL", len(still))
	}
	return fmt.Errorf("%s", msg)
}

// Proc is a process Leftovers found, and why it belongs to the test.
type Proc struct {
	PID  int
	Argv string
	Why  string // "HOME=…", "cwd …", "open …"
}

func (p Proc) String() string { return fmt.Sprintf("pid %d %q (%s)", p.PID, p.Argv, p.Why) }

// Leftovers returns the live processes, other than this one, whose HOME, working
// directory or an open file lies under one of dirs. By /proc facts only, never by name.
// A zombie counts as gone (PID 1 of some machines never reaps orphans): it has no
// environment, directory or files left to read.
func Leftovers(dirs ...string) []Proc {
	under := func(p string) bool {
		for _, d := range dirs {
			if d != "" && (p == d || strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/")) {
				return true
			}
		}
		return false
	}
	self := os.Getpid()
	var found []Proc
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		base := filepath.Join("/proc", e.Name())
		why := ""
		if env, err := os.ReadFile(filepath.Join(base, "environ")); err == nil {
			for _, kv := range strings.Split(string(env), "\x00") {
				if h, ok := strings.CutPrefix(kv, "HOME="); ok && under(h) {
					why = kv
				}
			}
		}
		if cwd, err := os.Readlink(filepath.Join(base, "cwd")); why == "" && err == nil && under(cwd) {
			why = "cwd " + cwd
		}
		if why == "" {
			fds, _ := os.ReadDir(filepath.Join(base, "fd"))
			for _, fd := range fds {
				if l, err := os.Readlink(filepath.Join(base, "fd", fd.Name())); err == nil && under(l) {
					why = "open " + l
					break
				}
			}
		}
		if why == "" {
			continue
		}
		argv, _ := os.ReadFile(filepath.Join(base, "cmdline"))
		found = append(found, Proc{PID: pid, Argv: strings.TrimSpace(strings.ReplaceAll(string(argv), "\x00", " ")), Why: why})
	}
	sort.Slice(found, func(i, j int) bool { return found[i].PID < found[j].PID })
	return found
}
