package cli

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/agent-dev/agent/internal/testbin"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"agent": func() { os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr)) },
	})
}

// TestScripts runs the CLI scenarios in testdata/script: each .txtar holds the plans, the
// commands, and the output and exit codes an operator would see. Run one with
// go test ./internal/cli -run TestScripts/NAME; add -testwork to keep its directory.
func TestScripts(t *testing.T) {
	t.Parallel()
	// The server scripts run the fake SGLang server (internal/fakesglang) as $FAKE_SGLANG_BIN.
	fake := testbin.FakeSGLang(t)
	// $MODEL_URL serves the quickstart's model directory on loopback, for downloads.
	model := testbin.QuickstartModel(t)
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exits":     exitsCmd,
			"normalize": normalizeCmd,
		},
		UpdateScripts: *update,
		Setup: func(env *testscript.Env) error {
			// A script ends with nothing of its own running (testbin.NoLeaks): its servers
			// write their logs and live under $WORK; one left is killed and fails the script.
			env.Defer(func() {
				if err := testbin.KillLeft(env.WorkDir); err != nil {
					env.T().Fatal(err)
				}
			})
			env.Setenv("STATE", env.WorkDir+"/state")
			// Plans in the scripts declare variable "root" and put every managed file
			// under it: file paths must be absolute, and $WORK differs per run.
			env.Setenv("AGENT_VAR_root", env.WorkDir+"/root")
			env.Setenv("FAKE_SGLANG_BIN", fake)
			env.Setenv("MODEL_URL", model.URL)
			// $PORT and $PORT2 are ports free when the script starts, for servers of its own.
			for _, name := range []string{"PORT", "PORT2"} {
				p, err := testbin.Port()
				if err != nil {
					return err
				}
				env.Setenv(name, strconv.Itoa(p))
			}
			return nil
		},
	})
}

// exitsCmd is `exits N program args...`: run the program like exec and require exit code
// N, so scripts can tell plan's 2 (changes) from 1 (error) and status's 3 (degraded).
func exitsCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: exits CODE program [args...]")
	}
	want, err := strconv.Atoi(args[0])
	if err != nil {
		ts.Fatalf("exits: %v", err)
	}
	got := 0
	if err := ts.Exec(args[1], args[2:]...); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			ts.Fatalf("exits: %v", err)
		}
		got = ee.ExitCode()
	}
	if got != want {
		ts.Fatalf("exit code %d, want %d", got, want)
	}
}

// The lock refusal names systemctl only for a holder that runs in a systemd service, and
// then that service (issue 29, point 4); its commands survive the shell as written.
func TestRefusalCommandsWorkAsWritten(t *testing.T) {
	for _, c := range []struct{ cgroup, unit string }{
		{"0::/system.slice/agent.service\n", "agent.service"},
		{"12:pids:/\n1:name=systemd:/system.slice/agent-gpu0.service\n0::/\n", "agent-gpu0.service"},
		{"0::/user.slice/user-0.slice/session-3.scope\n", ""},
		{"4:memory:/system.slice/other.service\n0::/\n", ""},
	} {
		if got := unitOfCgroup(c.cgroup); got != c.unit {
			t.Errorf("unitOfCgroup(%q) = %q, want %q", c.cgroup, got, c.unit)
		}
	}
	if got, want := shellJoin([]string{"agent", "status", "my plan.hcl", "-var", "name=it's", "--state-dir", "/var/lib/a"}),
		`agent status 'my plan.hcl' -var 'name=it'\''s' --state-dir /var/lib/a`; got != want {
		t.Errorf("shellJoin = %s, want %s", got, want)
	}
}
