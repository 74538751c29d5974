// Package testbin builds the project's programs for tests that run them as real
// processes (the agent CLI, the fake SGLang), once per test binary, and hands out free
// loopback ports. It exists so that a dozen test packages do not each carry their own
// copy of the same build-and-cache code.
//
// The fake SGLang is built statically (CGO_ENABLED=0), so the same file runs on the
// host and inside a busybox container. Binaries live in a directory
// <tmp>/agent-testbin-<random>-locked whose lock file the test process holds (flock) while it
// lives; the next build removes every directory whose lock nobody holds, so test
// packages need no TestMain to clean up after themselves. A lock, not a PID: test
// processes in other PID namespaces (CI's runners, `unshare -p`) share /tmp, and a PID
// from one namespace says nothing in another.
package testbin

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The packages built.
const (
	agentPkg = "github.com/agent-dev/agent"
	fakePkg  = "github.com/agent-dev/agent/internal/fakesglang"
)

var (
	mu    sync.Mutex
	built = map[string]result{}
)

type result struct {
	path string
	err  error
}

// Agent returns the path of the agent binary.
func Agent(tb testing.TB) string {
	tb.Helper()
	return build(tb, "agent", agentPkg, nil)
}

// FakeSGLang returns the path of the fake SGLang server (static).
func FakeSGLang(tb testing.TB) string {
	tb.Helper()
	return build(tb, "fake-sglang", fakePkg, []string{"CGO_ENABLED=0"})
}

func build(tb testing.TB, name, pkg string, env []string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	r, ok := built[pkg]
	if !ok {
		r = compile(name, pkg, env)
		built[pkg] = r
	}
	if r.err != nil {
		tb.Fatal(r.err)
	}
	return r.path
}

func compile(name, pkg string, env []string) result {
	dir, err := binDir()
	if err != nil {
		return result{err: err}
	}
	path := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", path, pkg)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return result{err: fmt.Errorf("go build %s: %v\n%s", pkg, err, out)}
	}
	return result{path: path}
}

var (
	dirOnce sync.Once
	dirPath string
	dirErr  error
	// dirLock is the open lock file of this process's directory: open for the life
	// of the process, so the flock on it lasts exactly as long.
	dirLock *os.File
)

// lockName is the file in each binaries directory that its test process holds locked.
const lockName = ".lock"

// binDir returns this process's binaries directory, created (after a sweep) and locked
// on first use.
func binDir() (string, error) {
	dirOnce.Do(func() {
		sweep()
		dir, err := os.MkdirTemp("", "agent-testbin-*-locked")
		if err != nil {
			dirErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			dirErr = err
			return
		}
		f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o644)
		if err == nil {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
		}
		if err != nil {
			dirErr = fmt.Errorf("lock %s: %w", dir, err)
			return
		}
		dirPath, dirLock = dir, f
	})
	return dirPath, dirErr
}

// staleUnlocked is how old a directory without a lock file (one being created, or left
// by an older testbin) must be before sweep removes it.
const staleUnlocked = 24 * time.Hour

// sweep removes the binaries directories of test processes that are gone: those whose
// lock file nobody holds. The exclusive lock sweep takes is released at once; a
// directory being created has no lock file yet and is left alone unless it is old.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "agent-testbin-*"))
	for _, d := range dirs {
		if dirLock != nil && d == filepath.Dir(dirLock.Name()) {
			continue // this process's own
		}
		f, err := os.Open(filepath.Join(d, lockName))
		if err != nil {
			if fi, serr := os.Stat(d); serr == nil && time.Since(fi.ModTime()) > staleUnlocked {
				os.RemoveAll(d)
			}
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(d)
		}
		f.Close()
	}
}

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call, taken below the
// kernel's ephemeral range and never twice in one test binary. Not from bind(":0"): that
// port lies in the ephemeral range, where any outgoing connection (a probe, a download)
// may take it as its local port before the test's process listens on it, and the listen
// then fails with "address already in use" (TestChaosRun's agent lost its metrics
// listener so, once in a loaded suite).
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := Port()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// Port is FreePort for callers without a testing.TB (a testscript's Setup).
func Port() (int, error) {
	lo, hi := 15000, ephemeralLow()
	portsMu.Lock()
	defer portsMu.Unlock()
	if hi-lo > 1000 {
		for range 200 {
			p := lo + rand.IntN(hi-lo)
			if portsGiven[p] {
				continue
			}
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				continue
			}
			ln.Close()
			portsGiven[p] = true
			return p, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// ephemeralLow is the lowest port the kernel hands to outgoing connections (32768 when
// it cannot be read, Linux's default).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// Servers returns the server processes that agents started for one test, mapped to
// their AGENT_SERVER marker: the processes whose environment holds that marker and a
// HOME that is dir or lies under it (each test gives its agents a directory of its own
// and a state directory inside it; a server's default HOME is <state dir>/home). By PID
// and environment only, never by name, as the agent itself finds them.
func Servers(dir string) map[int]string {
	found := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		var marker string
		mine := false
		for _, kv := range strings.Split(string(env), "\x00") {
			switch {
			case strings.HasPrefix(kv, "AGENT_SERVER="):
				marker = kv
			case kv == "HOME="+dir || strings.HasPrefix(kv, "HOME="+dir+"/"):
				mine = true
			}
		}
		if mine && marker != "" {
			found[pid] = marker
		}
	}
	return found
}

// KillServers SIGKILLs the servers of Servers(dir) and their process groups, and waits
// (up to 10 s) until they are gone: a test's cleanup, so that a failed test leaves
// nothing running.
func KillServers(dir string) {
	for pid := range Servers(dir) {
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	for deadline := time.Now().Add(10 * time.Second); len(Servers(dir)) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
}
