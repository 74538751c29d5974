package lifecycle

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The container's preflight script, run by a real shell here (inside an instance it runs
// the same way, through incus exec): each check exits with the code Incus.Preflight maps.
func TestPreflightScript(t *testing.T) {
	t.Parallel()
	shells := [][]string{{"/bin/sh"}}
	if bb, err := exec.LookPath("busybox"); err == nil {
		shells = append(shells, []string{bb, "sh"}) // what the test containers run
	}
	for _, sh := range shells {
		t.Run(strings.Join(sh, " "), func(t *testing.T) { t.Parallel(); preflightScriptIn(t, sh) })
	}
}

func preflightScriptIn(t *testing.T, sh []string) {
	run := func(dir, prog string) int {
		cmd := exec.Command(sh[0], append(sh[1:], "-c", preflightScript, "agent-preflight", dir, "qwen", "2", prog)...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	base := t.TempDir()
	ok := filepath.Join(base, "ok")
	if code := run(ok, "sh"); code != 0 {
		t.Errorf("a good launch: exit %d", code)
	}
	if ents, _ := os.ReadDir(ok); len(ents) != 0 {
		t.Errorf("preflight left files: %v", ents)
	}
	if code := run(ok, "pyhton3"); code != exitCommand {
		t.Errorf("a missing command: exit %d", code)
	}
	if code := run(ok, filepath.Join(base, "nope")); code != exitCommand {
		t.Errorf("a missing absolute command: exit %d", code)
	}
	os.WriteFile(filepath.Join(ok, "qwen.2.log"), nil, 0o644)
	if code := run(ok, "sh"); code != exitLogExists {
		t.Errorf("an existing log: exit %d", code)
	}
	link := filepath.Join(base, "link")
	os.MkdirAll(filepath.Join(link, "qwen.log"), 0o755)
	if code := run(link, "sh"); code != exitLinkNotSym {
		t.Errorf("a directory at the link: exit %d", code)
	}
	file := filepath.Join(base, "file")
	os.WriteFile(file, nil, 0o644)
	if code := run(file, "sh"); code != exitLogDir {
		t.Errorf("a file as the log dir: exit %d", code)
	}
}

// The host's preflight names what is wrong and wraps ErrPreflight.
func TestHostPreflight(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	l := &Lifecycle{Place: Local{}}
	log := LogFile{Dir: filepath.Join(base, "logs"), Name: "qwen", Generation: 1}
	if err := l.Preflight(context.Background(), Spec{Argv: []string{"sh", "-c", "true"}}, log); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Argv: []string{"pyhton3"}}, `command "pyhton3" is not found in PATH`},
		{Spec{Argv: []string{"/bin/sh"}, Workdir: filepath.Join(base, "nowhere")}, "workdir"},
		{Spec{Argv: []string{"/bin/sh"}, User: "no-such-user-here"}, "no-such-user-here"},
	} {
		err := l.Preflight(context.Background(), tc.spec, log)
		if !errors.Is(err, ErrPreflight) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}
