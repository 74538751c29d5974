package server

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// Point 7(a): a launch the agent stopped for ready.timeout is reported as such by status,
// with the lines it quoted from that launch's log.
func TestStatusSaysTheAgentStoppedALaunchForReadyTimeout(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	vars := []string{"faults=slow-start=60s", "ready_timeout=2s"}
	if st := h.apply(vars...); st.Err == nil || !strings.Contains(st.Err.Error(), "ready.timeout") {
		t.Fatalf("apply: %v", st.Err)
	}
	st := h.status(vars...)
	mustOK(t, st)
	if st.Status.Healthy || !strings.Contains(st.Status.Summary, "generation 1 was stopped by the agent") ||
		!strings.Contains(st.Status.Summary, "(ready.timeout)") || !strings.Contains(fieldOf(st.Status, "log tail"), "Load weight begin") {
		t.Errorf("status = %+v", st.Status)
	}
}

// Point 7(b): while an apply stops a generation (here one that ignores SIGTERM, so the
// stop takes its stop.timeout), status never calls it ready.
func TestStatusNeverCallsAGenerationBeingStoppedReady(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply("faults=ignore-sigterm"))
	first := h.record()
	vars := []string{"faults=ignore-sigterm", "mem=0.85", "stop_timeout=8s"}
	done := make(chan *agent.Step, 1)
	go func() { done <- h.engine(vars...).Apply(context.Background(), nil).Steps[0] }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var r serverRecord
		if ok, _ := h.store.Load("server.qwen", &r); ok && !r.StoppingSince.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the apply never recorded that it is stopping generation 1")
		}
	}
	if !alive(first.id()) {
		t.Fatal("generation 1 is gone already: the test proves nothing")
	}
	st := h.status(vars...)
	mustOK(t, st)
	if st.Status.Healthy || fieldOf(st.Status, "readiness") == "ready" || !strings.Contains(st.Status.Summary, "being stopped") {
		t.Errorf("status during the stop = %+v", st.Status)
	}
	mustOK(t, <-done)
	if r := h.record(); r.Generation != 2 || !r.StoppingSince.IsZero() {
		t.Errorf("record after the apply: %+v", r)
	}
	if st := h.status(vars...); !st.Status.Healthy {
		t.Errorf("status after the apply = %+v", st.Status)
	}
}

// Point 7(c): a recorded server that is gone while a foreign process holds its port:
// status names that process.
func TestStatusNamesTheForeignPortHolder(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	h.kill()
	foreign := exec.Command(fakeSGLang(t), "--model-path", "someone/else", "--port", strconv.Itoa(h.port))
	foreign.Env = []string{"FAKE_SGLANG_DECODE_INTERVAL=0"}
	foreign.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	go foreign.Wait()
	t.Cleanup(func() { _ = syscall.Kill(-foreign.Process.Pid, syscall.SIGKILL) })
	fid := waitPortOwner(t, h.port)
	st := h.status()
	mustOK(t, st)
	want := fmt.Sprintf("port %d is held by pid %d", h.port, fid.PID)
	if st.Status.Healthy || !strings.Contains(st.Status.Summary, want) || !strings.Contains(fieldOf(st.Status, "port"), "someone/else") {
		t.Errorf("status = %+v, want %q", st.Status, want)
	}
}

// Point 8: the smoke test (a real completion) runs after a launch and on demand, never
// on a plain status: status shows the launch's verdict and sends no completion.
func TestStatusRunsNoSmokeTestUnlessAsked(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	lc := &lifecycle.Lifecycle{Place: lifecycle.Local{}}
	requests := func() float64 {
		m, err := lc.Metrics(context.Background(), h.port)
		if err != nil || m.Requests == nil {
			t.Fatalf("/metrics: %v %+v", err, m)
		}
		return *m.Requests
	}
	before := requests()
	for range 3 {
		st := h.status()
		mustOK(t, st)
		if !st.Status.Healthy || !strings.Contains(fieldOf(st.Status, "smoke test"), "passed at launch") {
			t.Errorf("status = %+v", st.Status)
		}
	}
	mustLeaveAlone(t, h.plan, h.apply, h.record, h.record())
	if n := requests(); n != before {
		t.Errorf("status, plan and apply sent %v completions to a healthy server, want none", n-before)
	}
	st := h.probe()
	mustOK(t, st)
	if n := requests(); n != before+1 || !strings.HasPrefix(fieldOf(st.Status, "smoke test"), "passed (repetition") {
		t.Errorf("status --smoke: %v completions, smoke test %q", n-before, fieldOf(st.Status, "smoke test"))
	}
}

// Point 6: takeover = true when the recorded server is already dead and a foreign process
// holds the port: the previous generation's stop does not wait for a port it cannot free,
// the foreign holder is stopped (verified) and the server launched.
func TestServerTakeoverWhenOurServerIsDeadAndTheirsHoldsThePort(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	h.kill()
	foreign := exec.Command(fakeSGLang(t), "--model-path", "someone/else", "--port", strconv.Itoa(h.port))
	foreign.Env = []string{"FAKE_SGLANG_DECODE_INTERVAL=0"}
	foreign.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := foreign.Start(); err != nil {
		t.Fatal(err)
	}
	go foreign.Wait()
	t.Cleanup(func() { _ = syscall.Kill(-foreign.Process.Pid, syscall.SIGKILL) })
	fid := waitPortOwner(t, h.port)
	if st := h.apply(); st.Err == nil || !alive(fid) {
		t.Fatalf("without takeover: %v, foreign alive %v", st.Err, alive(fid))
	}
	start := time.Now()
	mustOK(t, h.apply("takeover=true"))
	if alive(fid) {
		t.Error("the foreign port holder survived the takeover")
	}
	if r := h.record(); r.Generation != first.Generation+1 || !alive(r.id()) {
		t.Errorf("record after the takeover: %+v", r)
	}
	t.Logf("takeover and launch took %s", time.Since(start))
}

// immutable makes dir unwritable even for root: chattr +i, or where the filesystem has no
// such attribute, a read-only bind mount of it onto itself. Undone when the test ends.
func immutable(t *testing.T, dir string) {
	t.Helper()
	if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err == nil {
		t.Cleanup(func() { exec.Command("chattr", "-i", dir).Run() })
		return
	} else if out2, err2 := exec.Command("mount", "--bind", "-o", "ro", dir, dir).CombinedOutput(); err2 != nil {
		t.Fatalf("cannot make %s unwritable for root: chattr: %s; mount: %s", dir, out, out2)
	}
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
}

// Point 4: check before break. A typo in command, a log directory root cannot write, and
// a directory where the current log link goes each leave the healthy server running,
// untouched, with an error that says so; a start that fails after the stop says that the
// previous generation was stopped.
func TestServerRelaunchChecksFirstThenStops(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	untouched := func(what string, st *agent.Step, want ...string) {
		t.Helper()
		if st.Err == nil {
			t.Fatalf("%s: applied", what)
		}
		for _, w := range append(want, "not stopping generation 1") {
			if !strings.Contains(st.Err.Error(), w) {
				t.Errorf("%s: error lacks %q: %v", what, w, st.Err)
			}
		}
		if r := h.record(); r.id() != first.id() || !alive(first.id()) {
			t.Fatalf("%s: the healthy server was stopped: %+v", what, r)
		}
	}
	untouched("typo in an absolute command", h.apply("fake="+fakeSGLang(t)+"x"), "no such file")
	untouched("typo in a bare command", h.apply("fake=fake-sglangg"), `command "fake-sglangg" is not found in PATH`)
	os.WriteFile(filepath.Join(h.dir, "notexec"), []byte("#!/bin/sh\n"), 0o644)
	untouched("a command that is not executable", h.apply("fake="+filepath.Join(h.dir, "notexec")), "is not an executable file")

	ro := filepath.Join(h.dir, "ro")
	os.Mkdir(ro, 0o755)
	immutable(t, ro)
	untouched("a log dir root cannot write", h.apply("logs="+ro, "mem=0.85"), "log dir "+ro+" is not writable")

	dirAtLink := filepath.Join(h.dir, "linkdir")
	os.MkdirAll(filepath.Join(dirAtLink, "qwen.log"), 0o755)
	untouched("a directory at the log link", h.apply("logs="+dirAtLink, "mem=0.85"), "qwen.log exists and is not a symlink")

	// log_dir is not part of the identity: the flag change above is the relaunch.
	// What cannot be checked first (here an OOM while loading) fails after the stop,
	// and the error says that the previous generation was stopped.
	// (revert = false: with it, the change is rolled back, server_revert_test.go.)
	st := h.apply("faults=oom", "revert=false")
	if st.Err == nil || !strings.Contains(st.Err.Error(), fmt.Sprintf("generation 1 (pid %d) was stopped, verified, then: launch of generation 2 failed", first.PID)) {
		t.Errorf("apply of an OOM: %v", st.Err)
	}
}
