package lifecycle

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/proc"
)

// runScript runs a remote script here as the instance would run it (busybox's sh when
// there is one, the system's POSIX sh otherwise) and splits off the namespace line.
func runScript(t *testing.T, script string, args ...string) (string, []byte, int) {
	t.Helper()
	argv := append([]string{"sh", "-c", script, "agent-test"}, args...)
	if bb, err := exec.LookPath("busybox"); err == nil {
		argv = append([]string{bb}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	ns, rest, ok := parseNSLine(out)
	if !ok {
		t.Fatalf("%s: no namespace line in %q (stderr %q, exit %d)", argv[0], out, stderr.String(), code)
	}
	return ns, rest, code
}

// A process to observe: a sleep in a session of its own, carrying a marker.
func startMarked(t *testing.T, marker string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.Env = []string{"PATH=/usr/bin:/bin", marker}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// The remote scripts, run against this host's /proc, read what proc.FS reads: the
// namespace identity, a process's stat and command line, the marked processes, and
// the signal that reaches only the process whose start time is the recorded one.
func TestRemoteScriptsReadProc(t *testing.T) {
	t.Parallel()
	marker := "AGENT_SERVER=server.t#1@" + strconv.FormatInt(time.Now().UnixNano(), 10)
	cmd := startMarked(t, marker)
	pid := cmd.Process.Pid
	want, err := (proc.FS{}).Stat(pid)
	if err != nil {
		t.Fatal(err)
	}

	ns, _, _ := runScript(t, nsScript)
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	init, err := (proc.FS{}).Stat(1)
	if err != nil {
		t.Fatal(err)
	}
	if wantNS := strings.TrimSpace(string(boot)) + "/" + strconv.FormatUint(init.StartTicks, 10); ns != wantNS {
		t.Errorf("namespace %q, want %q", ns, wantNS)
	}

	_, out, code := runScript(t, readScript, strconv.Itoa(pid), "stat", "")
	got, err := proc.ParseStat(out)
	if code != 0 || err != nil || got.Identity() != want.Identity() || got.Session != pid {
		t.Errorf("stat: %+v %v (exit %d), want %+v", got, err, code, want)
	}
	_, out, _ = runScript(t, readScript, strconv.Itoa(pid), "cmdline", "")
	if argv := splitNUL(out); !slices.Equal(argv, []string{"sleep", "60"}) {
		t.Errorf("cmdline %q", argv)
	}
	_, out, _ = runScript(t, readScript, strconv.Itoa(pid), "environ", "")
	if env := splitNUL(out); !slices.Contains(env, marker) {
		t.Errorf("environ %q lacks the marker", env)
	}
	_, out, _ = runScript(t, readScript, strconv.Itoa(pid), "cwd", "link")
	if wd, _ := os.Getwd(); strings.TrimSpace(string(out)) != wd {
		t.Errorf("cwd %q, want %q", out, wd)
	}
	_, out, _ = runScript(t, readScript, strconv.Itoa(pid), "status", "")
	if r, e, err := parseUIDs(out); err != nil || int(r) != os.Getuid() || int(e) != os.Geteuid() {
		t.Errorf("uids %d %d %v", r, e, err)
	}
	if _, _, code := runScript(t, readScript, "999999999", "stat", ""); code != exitNoProcess {
		t.Errorf("a missing pid: exit %d, want %d", code, exitNoProcess)
	}
	_, out, _ = runScript(t, nsScript+"cat /proc/stat")
	if bt, err := parseBtime(out); err != nil || bt.IsZero() {
		t.Errorf("btime %v %v", bt, err)
	}

	_, out, _ = runScript(t, listScript, marker)
	all, marked := parseList(out)
	i := slices.IndexFunc(all, func(s proc.Stat) bool { return s.PID == pid })
	if i < 0 || all[i].Identity() != want.Identity() {
		t.Fatalf("the list lacks pid %d (%d processes)", pid, len(all))
	}
	if len(marked) != 1 || !marked[pid] {
		t.Errorf("marked %v, want only %d", marked, pid)
	}
	set := targetSet(all, marked, proc.Target{Leader: want.Identity(), PGID: pid, SID: pid, Marker: marker}, nil)
	if len(set) != 1 || set[0].PID != pid {
		t.Errorf("target set %v, want pid %d alone", set, pid)
	}

	// A wrong start time: not signalled. The right one: signalled.
	_, out, _ = runScript(t, signalScript, "15", "0", strconv.Itoa(pid)+":"+strconv.FormatUint(want.StartTicks+1, 10)+":-")
	if len(out) != 0 {
		t.Errorf("signalled a pid whose start time differs: %q", out)
	}
	if alive, _ := (proc.FS{}).Alive(want.Identity()); !alive {
		t.Fatal("the process died of a signal meant for another start time")
	}
	_, out, _ = runScript(t, signalScript, "15", strconv.Itoa(pid), strconv.Itoa(pid)+":"+strconv.FormatUint(want.StartTicks, 10)+":g")
	if string(out) != "group "+strconv.Itoa(pid)+"\n" {
		t.Errorf("signal output %q, want the group", out)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "terminated") {
		t.Errorf("the process ended with %v, want SIGTERM", err)
	}
}

// The port script finds this test's own listener and names this process as its owner.
func TestRemotePortScript(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	_, out, code := runScript(t, portScript)
	owners, held, err := parsePortOwners(out, port)
	if code != 0 || err != nil || !held || !slices.Contains(owners, os.Getpid()) {
		t.Fatalf("port %d: owners %v held %v err %v (exit %d)", port, owners, held, err, code)
	}
	l.Close()
	_, out, _ = runScript(t, portScript)
	if owners, held, err := parsePortOwners(out, port); held || err != nil || len(owners) != 0 {
		t.Errorf("after close: owners %v held %v err %v", owners, held, err)
	}
}

// busybox's ls -l, as portScript gets it inside a container.
func TestParsePortOwnersBusybox(t *testing.T) {
	t.Parallel()
	out := `@@tcp
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:7531 00000000:0000 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 100 0 0 10 0
@@tcp6
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
@@fd
/proc/1/fd:
lrwx------    1 root     root            64 Dec  2 20:07 0 -> /dev/null
/proc/57/fd:
lr-x------    1 root     root            64 Dec  2 20:07 0 -> /dev/null
lrwx------    1 root     root            64 Dec  2 20:07 7 -> socket:[4242]

/proc/58/fd:
lrwx------    1 root     root            64 Dec  2 20:07 3 -> socket:[4343]
`
	owners, held, err := parsePortOwners([]byte(out), 30000)
	if err != nil || !held || !slices.Equal(owners, []int{57}) {
		t.Errorf("port 30000: %v %v %v, want [57]", owners, held, err)
	}
	if owners, held, _ := parsePortOwners([]byte(out), 30001); held || owners != nil {
		t.Errorf("port 30001 (not listening): %v %v", owners, held)
	}
}

func TestParseNSLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"ns 7e1c-4b/1234\nrest":  "7e1c-4b/1234",
		"ns 7e1c-4b/\nrest":      "",
		"ns /1234\n":             "",
		"7e1c-4b/1234\n":         "",
		"ns 7e1c-4b/12x4\nrest":  "",
		"ns 7e1c-4b/1234 no eol": "",
	} {
		got, _, ok := parseNSLine([]byte(in))
		if got != want || ok != (want != "") {
			t.Errorf("parseNSLine(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
}

// The remote stop picks its set as proc.FS.Stop does: the leader, its group and session
// while anchored by a member proved alive as itself, marker carriers and descendants;
// never PID 1, and never a group whose anchor is gone (its number may be reused).
func TestTargetSet(t *testing.T) {
	t.Parallel()
	st := func(pid, ppid, pgrp, sid int, ticks uint64) proc.Stat {
		return proc.Stat{PID: pid, PPID: ppid, PGRP: pgrp, Session: sid, StartTicks: ticks, State: 'S'}
	}
	leader := proc.Identity{PID: 20, StartTicks: 100}
	tg := proc.Target{Leader: leader, PGID: 20, SID: 20, Marker: "AGENT_SERVER=x"}
	pids := func(set []proc.Stat) []int {
		var out []int
		for _, s := range set {
			out = append(out, s.PID)
		}
		slices.Sort(out)
		return out
	}
	all := []proc.Stat{
		st(1, 0, 1, 1, 1),       // init
		st(20, 1, 20, 20, 100),  // the leader
		st(21, 20, 20, 20, 101), // a child in its group
		st(30, 1, 30, 30, 102),  // a child that left the session (marked)
		st(31, 30, 30, 30, 103), // its child
		st(40, 1, 40, 40, 50),   // a stranger
		st(41, 1, 20, 20, 90),   // in the group, started before the leader: not ours
	}
	got := pids(targetSet(all, map[int]bool{30: true}, tg, nil))
	if want := []int{20, 21, 30, 31}; !slices.Equal(got, want) {
		t.Errorf("with the leader: %v, want %v", got, want)
	}
	// The leader gone: its group's number proves nothing; only the marker does.
	noLeader := slices.DeleteFunc(slices.Clone(all), func(s proc.Stat) bool { return s.PID == 20 })
	got = pids(targetSet(noLeader, map[int]bool{30: true}, tg, nil))
	if want := []int{30, 31}; !slices.Equal(got, want) {
		t.Errorf("without the leader: %v, want %v", got, want)
	}
	// A member proved earlier anchors the group again.
	known := map[proc.Identity]proc.Stat{{PID: 21, StartTicks: 101}: all[2]}
	got = pids(targetSet(noLeader, nil, tg, known))
	if want := []int{21}; !slices.Equal(got, want) {
		t.Errorf("anchored by a known member: %v, want %v", got, want)
	}
	// A marked PID 1 is never taken.
	if got := pids(targetSet(all, map[int]bool{1: true}, proc.Target{Leader: proc.Identity{PID: 99}, Marker: "A=b"}, nil)); len(got) != 0 {
		t.Errorf("init taken: %v", got)
	}
}
