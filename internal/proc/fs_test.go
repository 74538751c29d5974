package proc

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeProc is one process of a fake procfs tree.
type fakeProc struct {
	pid, ppid, pgrp, sid int
	comm                 string
	state                string
	start                uint64
	cmdline, environ     string // NUL-separated, as the kernel writes them
	cwd                  string
	fds                  map[string]string // fd number -> link target
	rawStat              string            // when set, written instead
}

// writeTree builds a fake procfs under a temporary directory.
func writeTree(t *testing.T, procs []fakeProc, files map[string]string) FS {
	t.Helper()
	root := t.TempDir()
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		mustWrite(t, filepath.Join(dir, "cmdline"), p.cmdline)
		mustWrite(t, filepath.Join(dir, "environ"), p.environ)
		stat := p.rawStat
		if stat == "" {
			state := p.state
			if state == "" {
				state = "S"
			}
			stat = strings.Join([]string{
				strconv.Itoa(p.pid), "(" + p.comm + ")", state,
				strconv.Itoa(p.ppid), strconv.Itoa(p.pgrp), strconv.Itoa(p.sid),
				strings.Replace(tail, "80921", strconv.FormatUint(p.start, 10), 1),
			}, " ") + "\n"
		}
		mustWrite(t, filepath.Join(dir, "stat"), stat)
		if p.cwd != "" {
			mustSymlink(t, p.cwd, filepath.Join(dir, "cwd"))
		}
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		for fd, target := range p.fds {
			mustSymlink(t, target, filepath.Join(dir, "fd", fd))
		}
	}
	for name, content := range files {
		mustWrite(t, filepath.Join(root, name), content)
	}
	return FS{Root: root}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustSymlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// tree is a small host: init, a shell, a server leader with a worker, a
// grandchild re-parented to init but still in the server's group, a child
// that called setsid, and a stranger.
var tree = []fakeProc{
	{pid: 1, ppid: 0, pgrp: 1, sid: 1, comm: "init", start: 1},
	{pid: 50, ppid: 1, pgrp: 50, sid: 50, comm: "bash", start: 100},
	{pid: 100, ppid: 50, pgrp: 100, sid: 50, comm: "python3", start: 500,
		cmdline: "python3\x00-m\x00sglang.launch_server\x00", environ: "A=1\x00AGENT_LAUNCH=qwen/7\x00",
		cwd: "/srv/models"},
	{pid: 101, ppid: 100, pgrp: 100, sid: 50, comm: "sglang::sched (tp 0)", start: 510},
	{pid: 102, ppid: 1, pgrp: 100, sid: 50, comm: "orphan", start: 520},
	{pid: 103, ppid: 100, pgrp: 103, sid: 103, comm: "setsid)child", start: 530},
	{pid: 104, ppid: 103, pgrp: 103, sid: 103, comm: "grandchild", start: 540},
	{pid: 105, ppid: 101, pgrp: 100, sid: 50, comm: "dead", state: "Z", start: 550},
	{pid: 200, ppid: 1, pgrp: 200, sid: 200, comm: "stranger", start: 50},
}

func pids(ss []Stat) []int {
	out := []int{}
	for _, s := range ss {
		out = append(out, s.PID)
	}
	return out
}

func TestFakeTreeListing(t *testing.T) {
	t.Parallel()
	fs := writeTree(t, tree, map[string]string{"stat": "cpu 1 2 3\nbtime 1700000000\nprocesses 9\n"})
	mustWrite(t, filepath.Join(fs.Root, "self", "stat"), "not a pid dir") // skipped: not numeric
	mustWrite(t, filepath.Join(fs.Root, "sys", "x"), "")

	all, err := fs.All()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{1, 50, 100, 101, 102, 103, 104, 105, 200}, pids(all)); diff != "" {
		t.Errorf("All (-want +got):\n%s", diff)
	}
	tests := []struct {
		name string
		get  func() ([]Stat, error)
		want []int
	}{
		{"group 100", func() ([]Stat, error) { return fs.Group(100) }, []int{100, 101, 102, 105}},
		{"session 103", func() ([]Stat, error) { return fs.Session(103) }, []int{103, 104}},
		{"session 50", func() ([]Stat, error) { return fs.Session(50) }, []int{50, 100, 101, 102, 105}},
		{"descendants of 100", func() ([]Stat, error) { return fs.Descendants(100) }, []int{101, 103, 104, 105}},
		{"descendants of a leaf", func() ([]Stat, error) { return fs.Descendants(200) }, []int{}},
		{"descendants of a missing pid", func() ([]Stat, error) { return fs.Descendants(999) }, []int{}},
	}
	for _, tt := range tests {
		got, err := tt.get()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if diff := cmp.Diff(tt.want, pids(got)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestDescendantsSurvivesLoops(t *testing.T) {
	t.Parallel()
	// A corrupt or racing tree must not hang the walk.
	all := []Stat{{PID: 2, PPID: 3}, {PID: 3, PPID: 2}, {PID: 4, PPID: 4}}
	if diff := cmp.Diff([]int{3}, pids(Descendants(all, 2))); diff != "" {
		t.Errorf("Descendants (-want +got):\n%s", diff)
	}
}

func TestFakeTreeProcessFiles(t *testing.T) {
	t.Parallel()
	fs := writeTree(t, tree, map[string]string{"stat": "cpu 1 2 3\nbtime 1700000000\n"})

	argv, err := fs.Cmdline(100)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"python3", "-m", "sglang.launch_server"}, argv); diff != "" {
		t.Errorf("Cmdline (-want +got):\n%s", diff)
	}
	if argv, err := fs.Cmdline(101); err != nil || argv != nil {
		t.Errorf("Cmdline of empty file = %q, %v; want nil, nil", argv, err)
	}
	env, err := fs.Environ(100)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"A=1", "AGENT_LAUNCH=qwen/7"}, env); diff != "" {
		t.Errorf("Environ (-want +got):\n%s", diff)
	}
	if cwd, err := fs.Cwd(100); err != nil || cwd != "/srv/models" {
		t.Errorf("Cwd = %q, %v; want /srv/models", cwd, err)
	}

	boot, err := fs.BootTime()
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1700000000, 0); !boot.Equal(want) {
		t.Errorf("BootTime = %v, want %v", boot, want)
	}
	st, err := fs.StartTime(100) // 500 ticks = 5 s after boot
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1700000005, 0); !st.Equal(want) {
		t.Errorf("StartTime = %v, want %v", st, want)
	}
	if got, want := StartTime(time.Unix(10, 0), 1234), time.Unix(22, 340_000_000); !got.Equal(want) {
		t.Errorf("StartTime(10s, 1234 ticks) = %v, want %v", got, want)
	}

	for name, call := range map[string]func() error{
		"Stat":     func() error { _, err := fs.Stat(999); return err },
		"Cmdline":  func() error { _, err := fs.Cmdline(999); return err },
		"Environ":  func() error { _, err := fs.Environ(999); return err },
		"Cwd":      func() error { _, err := fs.Cwd(999); return err },
		"Identify": func() error { _, err := fs.Identify(999); return err },
	} {
		if err := call(); !errors.Is(err, ErrNoProcess) {
			t.Errorf("%s(missing pid) = %v, want ErrNoProcess", name, err)
		}
	}
}

func TestFakeTreeBadFiles(t *testing.T) {
	t.Parallel()
	fs := writeTree(t, []fakeProc{
		{pid: 1, comm: "init", start: 1},
		{pid: 7, rawStat: "7 (short) S 1 7"},
	}, map[string]string{"stat": "cpu 1 2 3\n"})

	if _, err := fs.Stat(7); !errors.Is(err, ErrBadStat) {
		t.Errorf("Stat of short line = %v, want ErrBadStat", err)
	}
	// A process whose stat cannot be read could be one to kill: listing
	// must fail rather than leave it out.
	if _, err := fs.All(); !errors.Is(err, ErrBadStat) {
		t.Errorf("All with a bad stat = %v, want ErrBadStat", err)
	}
	if _, err := fs.Alive(Identity{PID: 7, StartTicks: 1}); err == nil {
		t.Errorf("Alive on a bad stat = nil error; an unknown state must not read as gone")
	}
	if _, err := fs.BootTime(); err == nil {
		t.Errorf("BootTime without btime: no error")
	}
	if _, err := (FS{Root: filepath.Join(fs.Root, "absent")}).All(); err == nil {
		t.Errorf("All on a missing root: no error")
	}
}

func TestAliveFakeTree(t *testing.T) {
	t.Parallel()
	fs := writeTree(t, tree, nil)
	tests := []struct {
		id   Identity
		want bool
	}{
		{Identity{PID: 100, StartTicks: 500}, true},
		{Identity{PID: 100, StartTicks: 499}, false}, // PID reused
		{Identity{PID: 105, StartTicks: 550}, false}, // zombie counts as gone
		{Identity{PID: 999, StartTicks: 1}, false},   // absent
	}
	for _, tt := range tests {
		got, err := fs.Alive(tt.id)
		if err != nil || got != tt.want {
			t.Errorf("Alive(%v) = %v, %v; want %v", tt.id, got, err, tt.want)
		}
	}
}

const tcpHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

func TestPortOwnersFakeTree(t *testing.T) {
	t.Parallel()
	// Port 30000 is 0x7530.
	tcp := tcpHeader +
		"   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0\n" +
		// an established connection on the same port: not a listener
		"   1: 0100007F:7530 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1\n" +
		// a listener on another port
		"   2: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1 0000000000000000 100 0 0 10 0\n" +
		"   3: garbage line\n"
	tcp6 := tcpHeader +
		"   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 100 0 0 10 0\n"
	fs := writeTree(t, []fakeProc{
		{pid: 10, comm: "v4", start: 1, fds: map[string]string{"0": "/dev/null", "3": "socket:[1111]"}},
		{pid: 11, comm: "v6", start: 1, fds: map[string]string{"5": "socket:[4444]"}},
		{pid: 12, comm: "client", start: 1, fds: map[string]string{"3": "socket:[2222]"}},
		{pid: 13, comm: "other", start: 1, fds: map[string]string{"3": "socket:[3333]", "4": "pipe:[1111]"}},
	}, map[string]string{"net/tcp": tcp, "net/tcp6": tcp6})

	inodes, err := fs.ListeningInodes(30000)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]uint64{1111, 4444}, inodes); diff != "" {
		t.Errorf("ListeningInodes (-want +got):\n%s", diff)
	}
	got, err := fs.PortOwners(30000)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{10, 11}, got); diff != "" {
		t.Errorf("PortOwners(30000) (-want +got):\n%s", diff)
	}
	if got, err := fs.PortOwners(8080); err != nil || !cmp.Equal(got, []int{13}) {
		t.Errorf("PortOwners(8080) = %v, %v; want [13]", got, err)
	}
	if got, err := fs.PortOwners(1); err != nil || len(got) != 0 {
		t.Errorf("PortOwners(1) = %v, %v; want none", got, err)
	}

	noV6 := writeTree(t, nil, map[string]string{"net/tcp": tcp})
	if got, err := noV6.ListeningInodes(30000); err != nil || !cmp.Equal(got, []uint64{1111}) {
		t.Errorf("without tcp6: ListeningInodes = %v, %v; want [1111]", got, err)
	}
	if _, err := writeTree(t, nil, nil).ListeningInodes(30000); err == nil {
		t.Errorf("without net/tcp: no error")
	}
}
