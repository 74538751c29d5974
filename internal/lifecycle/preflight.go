package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/trust"
)

// Check before break: a relaunch first checks, where the server will run, everything
// that would make the start fail, so that a typo in the command or a log directory the
// agent cannot write never takes a healthy server down (issue 13, 4). Preflight changes
// nothing the launch would not (it may create the log directory) and leaves no file.

// ErrPreflight is wrapped by every failed preflight.
var ErrPreflight = errors.New("preflight failed")

// preflighter is a Place that can check a launch before it happens.
type preflighter interface {
	Preflight(ctx context.Context, s Spec, log LogFile) error
}

// Preflight checks that s could be started with log as its log: the command exists and
// is executable, the working directory exists, the log directory is trusted and
// writable, the generation's log file does not exist yet and <Name>.log is not in the
// way. The error wraps ErrPreflight and says what to fix.
func (l *Lifecycle) Preflight(ctx context.Context, s Spec, log LogFile) error {
	p, ok := l.Place.(preflighter)
	if !ok {
		return nil
	}
	if err := p.Preflight(ctx, s, log); err != nil {
		return fmt.Errorf("%w: %w", ErrPreflight, err)
	}
	return nil
}

// Preflight checks a launch on this host.
func (h Local) Preflight(ctx context.Context, s Spec, log LogFile) error {
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return errors.New("empty command")
	}
	// As exec.Command resolves it at the start: the agent's PATH for a bare name.
	prog := s.Argv[0]
	if !strings.Contains(prog, "/") {
		p, err := exec.LookPath(prog)
		if err != nil {
			return fmt.Errorf("command %q is not found in PATH (%s): fix command, or give its absolute path", prog, os.Getenv("PATH"))
		}
		prog = p
	}
	fi, err := os.Stat(prog)
	switch {
	case err != nil:
		return fmt.Errorf("command %q: %w", s.Argv[0], err)
	case !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("command %q (%s) is not an executable file (mode %v)", s.Argv[0], prog, fi.Mode())
	}
	if s.User != "" {
		if _, _, err := credential(s.User); err != nil {
			return err
		}
	}
	if wd := s.Workdir; wd != "" {
		if fi, err := os.Stat(wd); err != nil || !fi.IsDir() {
			return fmt.Errorf("workdir %s is not a directory", wd)
		}
	}
	if err := trust.Dir(log.Dir); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	if err := os.MkdirAll(log.Dir, 0o755); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	if err := linkCheck(log.Dir, log.Name); err != nil {
		return err
	}
	if _, err := os.Lstat(log.Path()); err == nil {
		return fmt.Errorf("%w: %s: move it aside", ErrLogExists, log.Path())
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("log %s: %w", log.Path(), err)
	}
	// Writable, with room for the new generation's log: a full disk is the host's
	// fault, found before a healthy generation is stopped (issue 27).
	if err := state.CheckRoom(log.Dir, state.MinFree); err != nil {
		return fmt.Errorf("log dir %w", err) // "log dir /var/log/agent is not writable: …"
	}
	return nil
}

// Exit codes of preflightScript (the launch scripts' own where they mean the same).
const exitCommand = 30

// preflightScript checks a launch inside the instance, with the environment the server
// would get (so PATH is its PATH). Arguments: dir, name, generation, command.
const preflightScript = `dir=$1 name=$2 gen=$3 prog=$4
log="$dir/$name.$gen.log"
cur="$dir/$name.log"
case $prog in
*/*) [ -f "$prog" ] && [ -x "$prog" ] || { echo "$prog is not an executable file" >&2; exit 30; } ;;
*) command -v "$prog" >/dev/null 2>&1 || { echo "$prog is not found in PATH ($PATH)" >&2; exit 30; } ;;
esac
mkdir -p -- "$dir" || exit 20
if [ -e "$cur" ] && [ ! -L "$cur" ]; then exit 21; fi
if [ -e "$log" ] || [ -L "$log" ]; then exit 17; fi
probe="$dir/.agent-preflight-$$"
( set -C; : >"$probe" ) || exit 24
rm -f -- "$probe"
`

// Preflight checks a launch inside the instance.
func (r *Incus) Preflight(ctx context.Context, s Spec, log LogFile) error {
	if len(s.Argv) == 0 || s.Argv[0] == "" {
		return errors.New("empty command")
	}
	home := "/root"
	if s.User != "" {
		_, _, h, err := r.lookupUser(ctx, s.User)
		if err != nil {
			return err
		}
		home = h
	}
	command := append([]string{"env", "-i", "--"}, r.environ(Spec{Env: s.Env}, home)...)
	command = append(command, "/bin/sh", "-c", preflightScript, "agent-preflight", log.Dir, log.Name, strconv.Itoa(log.Generation), s.Argv[0])
	res, err := r.Client.Exec(ctx, r.Instance, incus.ExecRequest{Command: command})
	if err != nil {
		return fmt.Errorf("in container %s: %w", r.Instance, err)
	}
	if res.ExitCode == exitCommand {
		return fmt.Errorf("command %q in container %s: %s: fix command", s.Argv[0], r.Instance, strings.TrimSpace(string(res.Stderr)))
	}
	if res.ExitCode != 0 {
		where := " in container " + r.Instance
		switch res.ExitCode {
		case exitLogExists:
			return fmt.Errorf("%w: %s%s: move it aside", ErrLogExists, path.Join(log.Dir, log.Name+"."+strconv.Itoa(log.Generation)+".log"), where)
		case exitLinkNotSym:
			return fmt.Errorf("%s%s exists and is not a symlink: move it aside (the agent keeps <name>.log as a link to the current generation's log)", CurrentLink(log.Dir, log.Name), where)
		case exitLogDir, exitLogCreate:
			return fmt.Errorf("log dir %s%s is not writable: %s", log.Dir, where, strings.TrimSpace(string(res.Stderr)))
		}
		return fmt.Errorf("preflight%s exited %d: %s", where, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return nil
}
