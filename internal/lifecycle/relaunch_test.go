package lifecycle

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The check before a revert: the old inputs run again only when their command, their
// model directory and their port are still there for them; each refusal names what is
// missing and wraps ErrCannotRelaunch.
func TestCanRelaunch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := t.TempDir()
	l := &Lifecycle{Place: Local{}}
	log := LogFile{Dir: filepath.Join(base, "logs"), Name: "qwen", Generation: 6}
	model := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := ln.Addr().(*net.TCPAddr).Port
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()

	ok := Spec{Argv: []string{"sh", "-c", "true"}}
	if err := l.CanRelaunch(ctx, ok, log, []string{model}, freePort, time.Second); err != nil {
		t.Fatalf("inputs that can run: %v", err)
	}
	for _, tc := range []struct {
		name  string
		spec  Spec
		paths []string
		port  int
		want  string
	}{
		{"command gone", Spec{Argv: []string{filepath.Join(base, "venv-old", "bin", "python3")}}, nil, 0, "venv-old/bin/python3"},
		{"model gone", ok, []string{filepath.Join(base, "Qwen-old")}, 0, "Qwen-old does not exist (in host)"},
		{"port taken", ok, []string{model}, held, "port"},
	} {
		err := l.CanRelaunch(ctx, tc.spec, log, tc.paths, tc.port, 200*time.Millisecond)
		if !errors.Is(err, ErrCannotRelaunch) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrCannotRelaunch naming %q", tc.name, err, tc.want)
		}
	}
}
