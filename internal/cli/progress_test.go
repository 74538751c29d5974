package cli

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal and returns its terminal side: what an operator's
// shell gives the agent as stdout and stderr.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminal here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlockpt: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("ptsname: %v", err)
	}
	tty, err := os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open the terminal side: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty
}

// Bars, with the escape codes that redraw them, only on a terminal that wants them: stdout
// and stderr both terminals, NO_COLOR unset, TERM not dumb. Anything else (output to a
// file, a pipe, the journal) gets plain progress lines.
func TestDrawsBarsOnlyOnATerminal(t *testing.T) {
	t.Parallel()
	tty := openPTY(t)
	file, err := os.Create(filepath.Join(t.TempDir(), "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	term := env(map[string]string{"TERM": "xterm-256color"})
	for _, tc := range []struct {
		name           string
		stdout, stderr *os.File
		getenv         func(string) string
		want           bool
	}{
		{"both terminals", tty, tty, term, true},
		{"stdout to a file", file, tty, term, false},
		{"stderr to a pipe (the journal)", tty, w, term, false},
		{"NO_COLOR set", tty, tty, env(map[string]string{"TERM": "xterm", "NO_COLOR": "1"}), false},
		{"TERM=dumb", tty, tty, env(map[string]string{"TERM": "dumb"}), false},
	} {
		if got := drawsBars(tc.stdout, tc.stderr, tc.getenv); got != tc.want {
			t.Errorf("%s: drawsBars = %v, want %v", tc.name, got, tc.want)
		}
	}
}
