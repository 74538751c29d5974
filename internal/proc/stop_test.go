package proc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var setpgid = &syscall.SysProcAttr{Setpgid: true}

func identify(t *testing.T, pid int) Identity {
	t.Helper()
	id, err := FS{}.Identify(pid)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestStopFirstSignal(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "term-exit", setpgid)
	pid := h.waitReady(t, 1)["term-exit"].pid
	id := identify(t, pid)

	rep, err := FS{}.Stop(testContext(t), Target{Leader: id, PGID: pid}, syscall.SIGTERM, 30*time.Second)
	if err != nil {
		t.Fatalf("Stop: %v (report %+v)", err, rep)
	}
	want := Report{Signal: syscall.SIGTERM, Targets: []Identity{id}, Exited: []Identity{id}}
	if diff := cmp.Diff(want, rep, cmpopts.IgnoreFields(Report{}, "Elapsed")); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	// The leader is our child: Stop saw it as a zombie, which counts as
	// gone. Reaping it shows what ended it.
	if ws := h.exitStatus(t); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("helper ended with %v, want killed by SIGTERM", ws)
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "ignore-term", setpgid)
	pid := h.waitReady(t, 1)["ignore-term"].pid
	id := identify(t, pid)

	rep, err := FS{}.Stop(testContext(t), Target{Leader: id, PGID: pid}, syscall.SIGTERM, 300*time.Millisecond)
	if err != nil {
		t.Fatalf("Stop: %v (report %+v)", err, rep)
	}
	want := Report{Signal: syscall.SIGTERM, Targets: []Identity{id}, Killed: []Identity{id}}
	if diff := cmp.Diff(want, rep, cmpopts.IgnoreFields(Report{}, "Elapsed")); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if ws := h.exitStatus(t); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("helper ended with %v, want killed by SIGKILL", ws)
	}
}

// TestStopTree stops a server-like tree whose members escape in each way a
// real server's children do, and proves every one is gone.
func TestStopTree(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		attr *syscall.SysProcAttr
		sid  bool
	}{
		{"process group", setpgid, false},
		{"session", &syscall.SysProcAttr{Setsid: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			marker := "PROC_TEST_LAUNCH=" + strconv.Itoa(os.Getpid()) + "/" + t.Name()
			h := startHelper(t, "tree", tc.attr, marker)
			ready := h.waitReady(t, 7)
			leader := ready["tree"].pid
			fs := FS{}

			// Let both orphaners exit (the leader reaps them), so their
			// children have been re-parented away from the tree.
			for _, name := range []string{"orphaner-group", "orphaner-setsid"} {
				waitGoneOrFail(t, ready[name].pid)
			}
			desc, err := fs.Descendants(leader)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"group-orphan", "setsid-orphan"} {
				if slices.Contains(pids(desc), ready[name].pid) {
					t.Fatalf("%s is still a descendant of the leader; the test proves nothing", name)
				}
			}
			so, err := fs.Stat(ready["setsid-orphan"].pid)
			if err != nil {
				t.Fatal(err)
			}
			if so.PGRP == leader || so.Session == leader {
				t.Fatalf("setsid-orphan %+v shares the leader's group or session", so)
			}

			ids := map[string]Identity{}
			for _, name := range []string{"tree", "worker", "setsid-child", "group-orphan", "setsid-orphan"} {
				ids[name] = identify(t, ready[name].pid)
			}
			target := Target{Leader: ids["tree"], PGID: leader, Marker: marker}
			if tc.sid {
				target.SID = leader
			}
			rep, err := fs.Stop(testContext(t), target, syscall.SIGTERM, time.Second)
			if err != nil {
				t.Fatalf("Stop: %v (report %+v)", err, rep)
			}
			sortIDs := cmpopts.SortSlices(func(a, b Identity) bool { return a.PID < b.PID })
			all := []Identity{ids["tree"], ids["worker"], ids["setsid-child"], ids["group-orphan"], ids["setsid-orphan"]}
			if diff := cmp.Diff(all, rep.Targets, sortIDs); diff != "" {
				t.Errorf("targets (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]Identity{ids["tree"]}, rep.Exited, sortIDs); diff != "" {
				t.Errorf("exited on SIGTERM (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(all[1:], rep.Killed, sortIDs); diff != "" {
				t.Errorf("needed SIGKILL (-want +got):\n%s", diff)
			}
			for name, id := range ids {
				if alive, err := fs.Alive(id); alive || err != nil {
					t.Errorf("%s %v alive=%v err=%v after Stop", name, id, alive, err)
				}
			}
		})
	}
}

func waitGoneOrFail(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := (FS{}).Stat(pid); errors.Is(err, ErrNoProcess) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not go away", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStopReusedPID gives Stop the right PID with the wrong start time, as
// after a reboot or a PID wrap: nothing may be signalled, neither the PID
// nor the process group that now bears its number.
func TestStopReusedPID(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "term-exit", setpgid)
	pid := h.waitReady(t, 1)["term-exit"].pid
	real := identify(t, pid)
	stale := Identity{PID: pid, StartTicks: real.StartTicks - 1}

	rep, err := FS{}.Stop(testContext(t), Target{Leader: stale, PGID: pid, SID: pid}, syscall.SIGTERM, time.Second)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !rep.LeaderGone || len(rep.Targets) != 0 {
		t.Errorf("report %+v, want leader gone and no targets", rep)
	}
	// A SIGTERM, had one been sent, ends this helper within moments.
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-h.waitC:
		t.Fatalf("the process at the reused PID exited: %v", err)
	default:
	}
	if alive, err := (FS{}).Alive(real); !alive || err != nil {
		t.Fatalf("process at the reused PID: alive=%v err=%v", alive, err)
	}
}

func TestStopAlreadyGone(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "term-exit", setpgid)
	pid := h.waitReady(t, 1)["term-exit"].pid
	target := Target{Leader: identify(t, pid), PGID: pid}
	if _, err := (FS{}).Stop(testContext(t), target, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	h.exitStatus(t) // reaped: the PID is now absent, not a zombie
	rep, err := FS{}.Stop(testContext(t), target, syscall.SIGTERM, 30*time.Second)
	if err != nil || !rep.LeaderGone || len(rep.Targets) != 0 {
		t.Errorf("second Stop = %+v, %v; want leader gone, nothing targeted, no error", rep, err)
	}
}

func TestStopCancelled(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "ignore-term", setpgid)
	pid := h.waitReady(t, 1)["ignore-term"].pid
	id := identify(t, pid)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	rep, err := FS{}.Stop(ctx, Target{Leader: id, PGID: pid}, syscall.SIGTERM, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want context.DeadlineExceeded", err)
	}
	if diff := cmp.Diff([]Identity{id}, rep.Survivors); diff != "" {
		t.Errorf("survivors (-want +got):\n%s", diff)
	}
}

// TestStopReportsSurvivors runs Stop against a tree in which the target
// never leaves, as a process stuck in uninterruptible sleep would look. The
// PID is a real helper, so the signals reach a process of ours.
func TestStopReportsSurvivors(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "ignore-term", setpgid)
	pid := h.waitReady(t, 1)["ignore-term"].pid
	fs := writeTree(t, []fakeProc{{
		pid: pid, ppid: os.Getpid(), pgrp: pid, sid: pid, comm: "stuck", state: "D", start: 42,
		cmdline: "python3\x00-m\x00sglang.launch_server\x00",
	}}, nil)
	if err := os.Symlink(strconv.Itoa(os.Getpid()), filepath.Join(fs.Root, "self")); err != nil {
		t.Fatal(err)
	}
	id := Identity{PID: pid, StartTicks: 42}
	rep, err := fs.Stop(testContext(t), Target{Leader: id, PGID: pid, KillWait: 200 * time.Millisecond}, syscall.SIGTERM, 100*time.Millisecond)
	if !errors.Is(err, ErrSurvived) {
		t.Fatalf("Stop = %v, want ErrSurvived", err)
	}
	for _, want := range []string{"pid " + strconv.Itoa(pid), "state D", "python3 -m sglang.launch_server"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if diff := cmp.Diff([]Identity{id}, rep.Survivors); diff != "" {
		t.Errorf("survivors (-want +got):\n%s", diff)
	}
	if len(rep.Exited)+len(rep.Killed) != 0 {
		t.Errorf("report claims exits: %+v", rep)
	}
}

func TestStopRefuses(t *testing.T) {
	t.Parallel()
	someone := Identity{PID: 999999, StartTicks: 1}
	// A fake tree in which this process (its self link is real) sits in
	// group 7001 of session 7000, its parent leads group 7002, and its
	// grandparent is in session 6000: the refusals must follow the ancestry
	// whatever session the test runner happens to have.
	me := os.Getpid()
	const parent, grandparent = 4190001, 4190002
	ancestry := writeTree(t, []fakeProc{
		{pid: 1, ppid: 0, pgrp: 1, sid: 1, comm: "init", start: 1},
		{pid: grandparent, ppid: 1, pgrp: 6000, sid: 6000, comm: "sshd", start: 2},
		{pid: parent, ppid: grandparent, pgrp: 7002, sid: 7000, comm: "bash", start: 3},
		{pid: me, ppid: parent, pgrp: 7001, sid: 7000, comm: "agent", start: 4},
	}, nil)
	if err := os.Symlink(strconv.Itoa(me), filepath.Join(ancestry.Root, "self")); err != nil {
		t.Fatal(err)
	}
	type refusal struct {
		name string
		fs   FS
		t    Target
		want error
	}
	tests := []refusal{
		{"pid 1", FS{}, Target{Leader: Identity{PID: 1}}, ErrUnsafeTarget},
		{"group 1", FS{}, Target{Leader: someone, PGID: 1}, ErrUnsafeTarget},
		{"session 1", FS{}, Target{Leader: someone, SID: 1}, ErrUnsafeTarget},
		{"bad marker", FS{}, Target{Leader: someone, Marker: "nokey"}, ErrUnsafeTarget},
		{"foreign root", writeTree(t, nil, nil), Target{Leader: someone}, ErrForeignRoot},
		{"own group", ancestry, Target{Leader: someone, PGID: 7001}, ErrUnsafeTarget},
		{"parent's group", ancestry, Target{Leader: someone, PGID: 7002}, ErrUnsafeTarget},
		{"own session", ancestry, Target{Leader: someone, SID: 7000}, ErrUnsafeTarget},
		{"grandparent's session", ancestry, Target{Leader: someone, SID: 6000}, ErrUnsafeTarget},
	}
	// The real process table too, where this runner can see its own group
	// and session: a session led from outside this PID namespace (as in
	// some CI containers) reads as 0 in /proc/self/stat, which names none.
	self, err := FS{}.Stat(me)
	if err != nil {
		t.Fatal(err)
	}
	if self.PGRP > 0 {
		tests = append(tests, refusal{"real own group", FS{}, Target{Leader: someone, PGID: self.PGRP}, ErrUnsafeTarget})
	}
	if self.Session > 0 {
		tests = append(tests, refusal{"real own session", FS{}, Target{Leader: someone, SID: self.Session}, ErrUnsafeTarget})
	}
	for _, tt := range tests {
		if _, err := tt.fs.Stop(testContext(t), tt.t, syscall.SIGTERM, time.Second); !errors.Is(err, tt.want) {
			t.Errorf("%s: Stop = %v, want %v", tt.name, err, tt.want)
		}
	}
	// A group or session nobody in the ancestry holds is not refused.
	if _, err := ancestry.Stop(testContext(t), Target{Leader: someone, PGID: 8000, SID: 8000}, syscall.SIGTERM, time.Second); err != nil {
		t.Errorf("unrelated group and session: Stop = %v, want nil", err)
	}
}

func TestSignalChecksIdentity(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "ignore-term", setpgid)
	pid := h.waitReady(t, 1)["ignore-term"].pid
	real := identify(t, pid)
	fs := FS{}

	if sent, err := fs.Signal(Identity{PID: pid, StartTicks: real.StartTicks + 1}, syscall.SIGKILL); sent || err != nil {
		t.Fatalf("Signal to a reused PID = %v, %v; want not sent", sent, err)
	}
	if alive, err := fs.Alive(real); !alive || err != nil {
		t.Fatalf("after a refused signal: alive=%v err=%v", alive, err)
	}
	if sent, err := fs.Signal(real, syscall.SIGKILL); !sent || err != nil {
		t.Fatalf("Signal to the real identity = %v, %v; want sent", sent, err)
	}
	if ws := h.exitStatus(t); ws.Signal() != syscall.SIGKILL {
		t.Errorf("helper ended with %v, want SIGKILL", ws)
	}
	if sent, err := fs.Signal(real, syscall.SIGKILL); sent || err != nil {
		t.Errorf("Signal to a reaped process = %v, %v; want not sent", sent, err)
	}
	if _, err := writeTree(t, nil, nil).Signal(real, 0); !errors.Is(err, ErrForeignRoot) {
		t.Errorf("Signal under a fake root = %v, want ErrForeignRoot", err)
	}
}

// TestZombieCountsAsGone keeps a killed child unreaped, as PID 1 leaves
// re-parented processes on the hosts: Alive and Stop must call it gone.
func TestZombieCountsAsGone(t *testing.T) {
	t.Parallel()
	ready := t.TempDir() + "/ready"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envMode+"=term-exit", envReady+"="+ready)
	cmd.SysProcAttr = setpgid
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	(&helper{ready: ready}).waitReady(t, 1)
	id := identify(t, pid)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := FS{}.Stat(pid)
		if err != nil {
			t.Fatal(err)
		}
		if s.State == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d never became a zombie: %+v", pid, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if alive, err := (FS{}).Alive(id); alive || err != nil {
		t.Errorf("Alive(zombie) = %v, %v; want false", alive, err)
	}
	rep, err := FS{}.Stop(testContext(t), Target{Leader: id, PGID: pid}, syscall.SIGTERM, time.Second)
	if err != nil || !rep.LeaderGone || len(rep.Targets) != 0 {
		t.Errorf("Stop(zombie) = %+v, %v; want leader gone, nothing targeted", rep, err)
	}
}

// A dead launch's group or session number may have been reused: a foreign process got
// the leader's old PID, led its own group and session, forked a child and exited. A
// stop of the old record must not signal that child (found in review), while a marked
// leftover of our own in the same situation is still stopped.
func TestStopOfDeadLeaderSparesAReusedGroup(t *testing.T) {
	t.Parallel()
	const marker = "AGENT_SERVER=server.qwen#1@1"
	for _, tc := range []struct {
		name     string
		env      []string
		wantKill bool
	}{
		{"foreign child in the reused group", nil, false},
		{"our marked leftover", []string{marker}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// sh leads a new session and group F, starts a child C there and exits (it is
			// reaped by Output), so nothing lives at F while C keeps group and session F.
			cmd := exec.Command("sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tc.env...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			f := cmd.Process.Pid
			c, _ := strconv.Atoi(strings.TrimSpace(string(out)))
			fs := FS{}
			// Wait for the child to be sleep itself: between fork and exec its environ
			// may briefly read as empty.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				if argv, _ := fs.Cmdline(c); len(argv) > 0 && argv[0] == "sleep" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("child %d never became sleep", c)
				}
			}
			child, err := fs.Stat(c)
			if err != nil || child.PGRP != f || child.Session != f {
				t.Fatalf("setup: child %+v, %v; want group and session %d", child, err, f)
			}
			t.Cleanup(func() { _, _ = fs.Signal(child.Identity(), syscall.SIGKILL) })

			// The record of an older launch that had PID F: it started before the child.
			old := Target{Leader: Identity{PID: f, StartTicks: child.StartTicks - 100}, PGID: f, SID: f, Marker: marker}
			rep, err := fs.Stop(testContext(t), old, syscall.SIGTERM, 2*time.Second)
			if err != nil {
				t.Fatalf("Stop: %v (report %+v)", err, rep)
			}
			alive, _ := fs.Alive(child.Identity())
			if alive == tc.wantKill {
				t.Errorf("child alive = %v after the stop, want %v (report %+v)", alive, !tc.wantKill, rep)
			}
		})
	}
}
