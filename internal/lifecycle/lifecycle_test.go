package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/testbin"
)

func freePort(t *testing.T) int { return testbin.FreePort(t) }

// options launches the fake on a free port with faults, ready on /health and the ready
// line, and kills whatever is left at the end of the test.
func options(t *testing.T, faults string, extra ...string) (*Lifecycle, LaunchOptions) {
	t.Helper()
	testbin.NoLeaks(t) // before killMarked's clean-up: it judges what that leaves
	port := freePort(t)
	marker := "AGENT_TEST_MARKER=" + t.Name() + strconv.Itoa(port)
	o := LaunchOptions{
		Name: "srv", LogDir: t.TempDir(), KeepLogs: 3, Generation: 1, Port: port,
		Spec: Spec{
			Argv:   append([]string{testbin.FakeSGLang(t), "--model-path", "Qwen/Qwen3-8B", "--port", strconv.Itoa(port), "--speculative-algorithm", "NEXTN", "--speculative-num-draft-tokens", "4"}, extra...),
			Env:    map[string]string{"FAKE_SGLANG": faults, "FAKE_SGLANG_DECODE_INTERVAL": "100ms"},
			Marker: marker,
		},
		Ready: Ready{HTTP: "/health", LogLine: engines.SGLangReadyLine, Timeout: 15 * time.Second},
	}
	l := &Lifecycle{Place: Local{}}
	t.Cleanup(func() { killMarked(marker) })
	return l, o
}

// killMarked SIGKILLs every process carrying marker: the test's own cleanup.
func killMarked(marker string) {
	all, _ := proc.FS{}.All()
	for _, s := range all {
		if env, err := (proc.FS{}).Environ(s.PID); err == nil {
			for _, e := range env {
				if e == marker {
					_ = syscall.Kill(s.PID, syscall.SIGKILL)
				}
			}
		}
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestLaunchReadyThenVerifiedStop(t *testing.T) {
	t.Parallel()
	l, o := options(t, "slow-start=300ms")
	x, err := l.Launch(ctx(t), o)
	if err != nil {
		t.Fatal(err)
	}
	if x.PGID != x.ID.PID || x.SID != x.ID.PID {
		t.Errorf("not in its own session and group: pid %d pgid %d sid %d", x.ID.PID, x.PGID, x.SID)
	}
	if x.LogPath != filepath.Join(o.LogDir, "srv.1.log") {
		t.Errorf("log path %s", x.LogPath)
	}
	if target, _ := os.Readlink(filepath.Join(o.LogDir, "srv.log")); target != "srv.1.log" {
		t.Errorf("srv.log -> %q, want srv.1.log", target)
	}
	// No pipe to us: the log file is the child's stdout and stderr.
	for _, fd := range []string{"1", "2"} {
		if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", x.ID.PID, fd)); got != x.LogPath {
			t.Errorf("fd %s of the server is %q, want its log file", fd, got)
		}
	}
	rep, err := l.Stop(ctx(t), x.Target(o.Spec.Marker), syscall.SIGTERM, 5*time.Second, o.Port)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Killed) != 0 || len(rep.Exited) == 0 {
		t.Errorf("a SIGTERM-abiding server needed SIGKILL: %+v", rep)
	}
	if alive, _ := (proc.FS{}).Alive(x.ID); alive {
		t.Error("leader alive after a verified stop")
	}
}

// ignore-sigterm, children that outlive a parent-only kill, a child in its own session
// and a child that holds the port: SIGTERM is escalated, every one is found and killed,
// and the port is proven free.
func TestStopEscalatesAndFindsEveryChild(t *testing.T) {
	t.Parallel()
	l, o := options(t, "ignore-sigterm,children=2,setsid-child,hold-port")
	x, err := l.Launch(ctx(t), o)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := l.Stop(ctx(t), x.Target(o.Spec.Marker), syscall.SIGTERM, 300*time.Millisecond, o.Port)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Targets) < 5 {
		t.Errorf("stop found %d processes, want the leader and its 4 children: %+v", len(rep.Targets), rep)
	}
	if len(rep.Killed) == 0 {
		t.Errorf("SIGTERM was ignored, yet nothing needed SIGKILL: %+v", rep)
	}
	for _, id := range rep.Targets {
		if alive, _ := (proc.FS{}).Alive(id); alive {
			t.Errorf("%v alive after the stop", id)
		}
	}
	if err := (proc.FS{}).PortFree(ctx(t), o.Port, 0); err != nil {
		t.Error(err)
	}
}

func TestLaunchFailuresQuoteTheirOwnLog(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		faults string
		extra  []string
		kind   engines.FailureKind
		line   string
	}{
		{faults: "oom", kind: engines.FailureOOM, line: "CUDA out of memory"},
		{faults: "oom=kv", kind: engines.FailureOOM, line: "Not enough memory"},
		{faults: "exit-on-start", kind: engines.FailureNoGPU, line: "No CUDA GPUs are available"},
		{faults: "cuda-graph-fail", kind: engines.FailureCUDAGraph, line: "Capture cuda graph failed"},
		{extra: []string{"--no-such-flag", "1"}, kind: engines.FailureBadFlag, line: "unrecognized arguments"},
	} {
		t.Run(string(tc.kind)+tc.faults, func(t *testing.T) {
			t.Parallel()
			l, o := options(t, tc.faults, tc.extra...)
			o.Generation = 7
			x, err := l.Launch(ctx(t), o)
			var le *LaunchError
			if !errors.As(err, &le) {
				t.Fatalf("err = %v, want a *LaunchError", err)
			}
			if le.Failure == nil || le.Failure.Kind != tc.kind {
				t.Errorf("failure = %+v, want %s", le.Failure, tc.kind)
			}
			msg := err.Error()
			for _, want := range []string{"generation 7", "process", "exited", tc.line, "srv.7.log"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error lacks %q:\n%s", want, msg)
				}
			}
			if alive, _ := (proc.FS{}).Alive(x.ID); alive {
				t.Error("failed launch left alive")
			}
		})
	}
}

func TestReadinessTimeoutStopsTheLaunch(t *testing.T) {
	t.Parallel()
	l, o := options(t, "slow-start=30s,children=1")
	o.Ready.Timeout = 3 * time.Second // long enough for the fake to log "Load weight begin" on a loaded machine
	x, err := l.Launch(ctx(t), o)
	var le *LaunchError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "not ready 3s after start") {
		t.Fatalf("err = %v", err)
	}
	// The readiness probes' access-log lines (one per poll, for 3 s) are quoted as one
	// line with their count, so what the server said last is still in the quote.
	if !strings.Contains(err.Error(), "Load weight begin") || !regexp.MustCompile(`"GET /health HTTP/1.1" 503 Service Unavailable  \(× \d+\)`).MatchString(err.Error()) {
		t.Errorf("the error does not quote the log's tail, /health probes collapsed:\n%v", err)
	}
	if alive, _ := (proc.FS{}).Alive(x.ID); alive {
		t.Error("the launch that never got ready is still alive")
	}
}

// The field report's loop: the server is healthy, the sampling makes it loop. The smoke
// test says so, and the server is left running.
func TestSmokeLoopLeavesServerRunning(t *testing.T) {
	t.Parallel()
	l, o := options(t, "loop")
	o.Smoke = &Smoke{Prompt: "What is 2+2? Answer with one number.", Sampling: map[string]any{"temperature": 0.7}, MaxTokens: 200, Expect: "4", MaxRepetition: 0.3}
	x, err := l.Launch(ctx(t), o)
	var se *SmokeError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *SmokeError", err)
	}
	if se.Result.Repetition < 0.5 || !strings.Contains(se.Result.Output, "The user is asking") {
		t.Errorf("result = %+v", se.Result)
	}
	if alive, _ := (proc.FS{}).Alive(x.ID); !alive {
		t.Fatal("a server whose output loops was stopped")
	}
	s := *o.Smoke
	s.Sampling = map[string]any{"temperature": 0.7, "presence_penalty": 1.5}
	r, err := RunSmoke(ctx(t), nil, l.Place.Endpoint(o.Port), s)
	if err != nil || !r.OK {
		t.Errorf("with a presence penalty: %+v, %v", r, err)
	}
}

func TestRepetition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text     string
		min, max float64
	}{
		{"2 + 2 = 4.", 0, 0},
		{"", 0, 0},
		{strings.Repeat("The user is asking for the result of 2+2. ", 20), 0.9, 1},
		{"a b c d e f g h a b c", 0.1, 0.2},
	} {
		if got := Repetition(tc.text); got < tc.min || got > tc.max {
			t.Errorf("Repetition(%.30q) = %.2f, want in [%.2f, %.2f]", tc.text, got, tc.min, tc.max)
		}
	}
}

func TestGenerationsAndPruning(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if n, _ := NextGeneration(dir, "srv", 0); n != 1 {
		t.Errorf("empty dir: next = %d", n)
	}
	for _, g := range []int{1, 2, 3, 9} {
		os.WriteFile(LogPath(dir, "srv", g), []byte("x\n"), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "srv.old.log"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "srv2.4.log"), nil, 0o644)
	// A lost state record (recorded 0) never reuses a log: the files count.
	if n, _ := NextGeneration(dir, "srv", 0); n != 10 {
		t.Errorf("next = %d, want 10", n)
	}
	if n, _ := NextGeneration(dir, "srv", 12); n != 13 {
		t.Errorf("next = %d, want 13", n)
	}
	if err := pruneLogs(dir, "srv", 2, 9); err != nil {
		t.Fatal(err)
	}
	gens, _ := generations(dir, "srv")
	if fmt.Sprint(gens) != "[3 9]" {
		t.Errorf("kept %v, want [3 9]", gens)
	}
	if err := linkCurrent(dir, "srv", 9); err != nil {
		t.Fatal(err)
	}
	if err := linkCurrent(dir, "srv", 3); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Readlink(CurrentLink(dir, "srv")); got != "srv.3.log" {
		t.Errorf("link = %q", got)
	}
	os.Remove(CurrentLink(dir, "srv"))
	os.WriteFile(CurrentLink(dir, "srv"), []byte("an operator's file"), 0o644)
	if err := linkCheck(dir, "srv"); err == nil {
		t.Error("a regular srv.log would be replaced")
	}
	// Start refuses a regular srv.log, and an existing log file: never an old file reused.
	if _, err := (Local{}).Start(context.Background(), Spec{Argv: []string{"/bin/true"}}, LogFile{Dir: dir, Name: "srv", Generation: 10, Keep: 5}); err == nil || !strings.Contains(err.Error(), "not a symlink") {
		t.Errorf("start with a regular srv.log: %v", err)
	}
	os.Remove(CurrentLink(dir, "srv"))
	_, err := Local{}.Start(context.Background(), Spec{Argv: []string{"/bin/true"}}, LogFile{Dir: dir, Name: "srv", Generation: 9, Keep: 5})
	if !errors.Is(err, ErrLogExists) {
		t.Errorf("start over an existing log: %v", err)
	}
}

// A launch whose record cannot be saved must not leave an unrecorded server running:
// the process is stopped, verified, and the error says so (found in review).
func TestLaunchStopsWhatItCannotRecord(t *testing.T) {
	t.Parallel()
	l, o := options(t, "")
	o.OnStarted = func(*Launched) error { return errors.New("save state: no space left on device") }
	x, err := l.Launch(ctx(t), o)
	if err == nil || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "could not be recorded, so it was stopped, verified gone") {
		t.Fatalf("Launch = %v, want the save error and the stop", err)
	}
	if x == nil {
		t.Fatal("no Launched for a started process")
	}
	if alive, _ := (proc.FS{}).Alive(x.ID); alive {
		t.Errorf("pid %d runs unrecorded", x.ID.PID)
	}
}
