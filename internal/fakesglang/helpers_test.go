package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// wait is the deadline of every wait in these tests: generous, because the
// machine is shared; nothing here asserts speed.
const wait = 20 * time.Second

// proc is one launched fake, in its own process group, logging to a file as
// the agent would run it.
type proc struct {
	cmd   *exec.Cmd
	log   string
	port  int
	done  chan struct{}
	state *os.ProcessState
}

// launch starts the fake with args (a --port is added unless given) and
// FAKE_SGLANG=faults; cleanup kills its process group.
func launch(t *testing.T, faults string, args ...string) *proc {
	t.Helper()
	return launchEnv(t, nil, faults, args...)
}

// launchEnv is launch with extra environment variables (NAME=value).
func launchEnv(t *testing.T, env []string, faults string, args ...string) *proc {
	t.Helper()
	p := &proc{log: filepath.Join(t.TempDir(), "server.log"), done: make(chan struct{})}
	if !strings.Contains(strings.Join(args, " "), "--port") {
		p.port = testbin.FreePort(t)
		args = append(args, "--port", strconv.Itoa(p.port))
	}
	f, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(testbin.FakeSGLang(t), args...)
	p.cmd.Env = append(append(os.Environ(), "FAKE_SGLANG="+faults, "FAKE_SGLANG_DECODE_INTERVAL=200ms"), env...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(wait):
			t.Errorf("fake %d not reaped after SIGKILL", p.cmd.Process.Pid)
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("log of the fake:\n%s", b)
		}
	})
	return p
}

func ctxWait(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// waitLog waits until the log holds substr.
func (p *proc) waitLog(ctx context.Context, t *testing.T, substr string) {
	t.Helper()
	for {
		b, _ := os.ReadFile(p.log)
		if bytes.Contains(b, []byte(substr)) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("log never showed %q: %v", substr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// waitExit waits for the fake to exit and returns its exit code (-1 when a
// signal ended it).
func (p *proc) waitExit(ctx context.Context, t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.state.ExitCode()
	case <-ctx.Done():
		t.Fatalf("fake did not exit: %v", ctx.Err())
	}
	return 0
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) url(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", p.port, path)
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

type chatResponse struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func (p *proc) chat(ctx context.Context, t *testing.T, body map[string]any) chatResponse {
	t.Helper()
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url("/v1/chat/completions"), bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		rb, _ := io.ReadAll(resp.Body)
		t.Fatalf("chat: status %d: %s", resp.StatusCode, rb)
	}
	var cr chatResponse
	if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil {
		t.Fatalf("chat: decode: %v", err)
	}
	if len(cr.Choices) != 1 {
		t.Fatalf("chat: %d choices", len(cr.Choices))
	}
	return cr
}

// childrenOf lists the PIDs whose parent is pid, from /proc.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procStat(n)
		if err == nil && st.ppid == pid {
			out = append(out, n)
		}
	}
	return out
}

type stat struct {
	state      byte
	ppid, pgrp int
	session    int
}

// procStat reads /proc/PID/stat: "pid (comm) S ppid pgrp session ...".
func procStat(pid int) (stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, errors.New("bad stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 4 {
		return stat{}, errors.New("bad stat")
	}
	var s stat
	s.state = f[0][0]
	s.ppid, _ = strconv.Atoi(f[1])
	s.pgrp, _ = strconv.Atoi(f[2])
	s.session, _ = strconv.Atoi(f[3])
	return s, nil
}

// alive reports whether pid runs (exists and is not a zombie).
func alive(pid int) bool {
	s, err := procStat(pid)
	return err == nil && s.state != 'Z'
}

// waitChildren waits until pid has n children.
func waitChildren(ctx context.Context, t *testing.T, pid, n int) []int {
	t.Helper()
	for {
		if c := childrenOf(t, pid); len(c) >= n {
			return c
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pid %d never had %d children", pid, n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitGone waits until none of pids runs.
func waitGone(ctx context.Context, t *testing.T, pids ...int) {
	t.Helper()
	for {
		var left []int
		for _, p := range pids {
			if alive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("processes %v still alive", left)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
