// Package testbin builds the project's programs for tests that run them as real
// processes (the agent CLI, the fake SGLang), once per test binary, and hands out free
// loopback ports. It exists so that a dozen test packages do not each carry their own
// copy of the same build-and-cache code.
//
// The fake SGLang is built statically (CGO_ENABLED=0), so the same file runs on the
// host and inside a busybox container. Binaries live in <tmp>/agent-testbin-<pid>; a
// directory whose process is gone is removed by the next build, so test packages need no
// TestMain to clean up after themselves.
package testbin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
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
	sweep()
	dir := filepath.Join(os.TempDir(), "agent-testbin-"+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
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

// sweep removes the binaries of test processes that are gone.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "agent-testbin-*"))
	for _, d := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "agent-testbin-"))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
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

// KillServers SIGKILLs the servers of Servers(dir) and their process groups: a
// test's cleanup, so that a failed test leaves nothing running.
func KillServers(dir string) {
	for pid := range Servers(dir) {
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
