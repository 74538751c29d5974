package proc

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Helper processes are this test binary run again with PROC_HELPER set to a
// mode. Each appends "NAME PID [PORT]" to the file named by PROC_HELPER_READY
// once it is ready, and exits by itself after helperLifetime so a failed
// test leaves nothing behind for long.
const (
	envMode  = "PROC_HELPER"
	envName  = "PROC_HELPER_NAME"
	envReady = "PROC_HELPER_READY"

	helperLifetime = 2 * time.Minute
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(envMode); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

func runHelper(mode string) int {
	name := os.Getenv(envName)
	if name == "" {
		name = mode
	}
	ready := func(extra ...string) {
		f, err := os.OpenFile(os.Getenv(envReady), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		line := strings.Join(append([]string{name, strconv.Itoa(os.Getpid())}, extra...), " ")
		fmt.Fprintln(f, line)
		f.Close()
	}
	spawn := func(mode, name string, attr *syscall.SysProcAttr) *exec.Cmd {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), envMode+"="+mode, envName+"="+name)
		cmd.SysProcAttr = attr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(3)
		}
		return cmd
	}
	switch mode {
	case "term-exit": // the Go runtime's default: SIGTERM ends the process
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
	case "listen":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		ready(strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
		time.Sleep(helperLifetime)
		return 0
	case "tree":
		// A server-like leader: a worker in its group, a child that
		// called setsid, a grandchild in the group whose parent exited,
		// and a grandchild that called setsid and whose parent exited.
		var kids []*exec.Cmd
		kids = append(kids, spawn("ignore-term", "worker", nil))
		kids = append(kids, spawn("ignore-term", "setsid-child", &syscall.SysProcAttr{Setsid: true}))
		kids = append(kids, spawn("orphaner", "orphaner-group", nil))
		kids = append(kids, spawn("orphaner", "orphaner-setsid", nil))
		for _, k := range kids {
			go k.Wait() // reap the orphaners
		}
	case "orphaner":
		var attr *syscall.SysProcAttr
		if name == "orphaner-setsid" {
			attr = &syscall.SysProcAttr{Setsid: true}
		}
		spawn("ignore-term", strings.TrimPrefix(name, "orphaner-")+"-orphan", attr)
		ready()
		return 0 // the grandchild re-parents
	default:
		fmt.Fprintf(os.Stderr, "unknown helper mode %q\n", mode)
		return 3
	}
	ready()
	time.Sleep(helperLifetime)
	return 0
}

// helper is a started helper process tree.
type helper struct {
	cmd   *exec.Cmd
	ready string
	waitC chan error // receives cmd.Wait's result once
}

// startHelper starts the test binary in mode as the leader of a new process
// group (or session), with extra environment entries.
func startHelper(t *testing.T, mode string, attr *syscall.SysProcAttr, env ...string) *helper {
	t.Helper()
	h := &helper{ready: t.TempDir() + "/ready", waitC: make(chan error, 1)}
	h.cmd = exec.Command(os.Args[0])
	h.cmd.Env = append(append(os.Environ(), envMode+"="+mode, envReady+"="+h.ready), env...)
	h.cmd.Stderr = os.Stderr
	h.cmd.SysProcAttr = attr
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { h.waitC <- h.cmd.Wait() }()
	t.Cleanup(func() {
		// Kill what is left of the tree by identity, then reap the leader.
		for _, l := range h.lines() {
			if id, err := (FS{}).Identify(l.pid); err == nil {
				(FS{}).Signal(id, syscall.SIGKILL)
			}
		}
		h.cmd.Process.Kill()
		select {
		case <-h.waitC:
		case <-time.After(10 * time.Second):
			t.Errorf("helper %d not reaped", h.cmd.Process.Pid)
		}
	})
	return h
}

type readyLine struct {
	name  string
	pid   int
	extra []string
}

func (h *helper) lines() []readyLine {
	f, err := os.Open(h.ready)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []readyLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		out = append(out, readyLine{name: f[0], pid: pid, extra: f[2:]})
	}
	return out
}

// waitReady waits until n helpers of the tree have reported ready and
// returns them by name.
func (h *helper) waitReady(t *testing.T, n int) map[string]readyLine {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines := h.lines()
		if len(lines) >= n {
			byName := make(map[string]readyLine)
			for _, l := range lines {
				byName[l.name] = l
			}
			return byName
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d helpers ready: %+v", len(lines), n, lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exitStatus waits for the leader and returns how it ended.
func (h *helper) exitStatus(t *testing.T) syscall.WaitStatus {
	t.Helper()
	select {
	case <-h.waitC:
	case <-time.After(10 * time.Second):
		t.Fatalf("helper %d did not exit", h.cmd.Process.Pid)
	}
	h.waitC <- nil // for the cleanup
	return h.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}
