package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/daemon"
	"github.com/agent-dev/agent/internal/state"
)

// acquireLock takes the state lock for a command that acts (plan, apply, destroy). A
// running `agent run` holds that lock for its whole life (it reconciles continuously, so
// a manual apply would be undone by its next reconcile, or would race it): the command
// is then refused at once, naming the daemon and what to do, whatever --lock-timeout
// says. Another command's lock is waited for up to timeout, as before.
func acquireLock(ctx context.Context, store *state.Store, o options, cmd, plan string) (*state.Lock, error) {
	lock, err := store.Acquire(ctx, 0, "agent "+cmd+" "+plan)
	if err == nil {
		return lock, nil
	}
	if refused := daemonRefusal(cmd, plan, o, err); refused != nil {
		return nil, refused
	}
	if o.lockTimeout <= 0 {
		return nil, err
	}
	lock, err = store.Acquire(ctx, o.lockTimeout, "agent "+cmd+" "+plan)
	if refused := daemonRefusal(cmd, plan, o, err); refused != nil {
		return nil, refused
	}
	return lock, err
}

// ErrDaemonHolds is wrapped by the refusal of a command while `agent run` holds the host.
var ErrDaemonHolds = errors.New("agent run manages this host")

// daemonRefusal turns a lock held by `agent run` into the refusal that says what to do,
// in commands that work as written: the status command carries this command's plan,
// state directory and variables, and systemctl is named only when the holder runs in a
// systemd unit (that unit's name), else the holder's PID is signalled. nil for any other
// error.
func daemonRefusal(cmd, plan string, o options, err error) error {
	var le *state.LockedError
	if !errors.As(err, &le) || !strings.HasPrefix(le.Holder.Command, daemon.DaemonCommand+" ") {
		return nil
	}
	who := fmt.Sprintf("%q (PID %d, since %s)", le.Holder.Command, le.Holder.PID, agent.HumanTime(le.Holder.Since))
	what := "it would undo a manual change at its next reconcile"
	if cmd == "plan" {
		what = "it observes and repairs continuously"
	}
	reload, stop := fmt.Sprintf("kill -HUP %d", le.Holder.PID), fmt.Sprintf("kill %d; it finishes the step in flight", le.Holder.PID)
	if unit := systemdUnit(le.Holder.PID); unit != "" {
		name := strings.TrimSuffix(unit, ".service")
		reload, stop = "systemctl reload "+name, "systemctl stop "+name
	}
	status := []string{"agent", "status", plan}
	if o.stateDir != "" {
		status = append(status, "--state-dir", o.stateDir)
	}
	for _, v := range o.vars {
		status = append(status, "-var", v)
	}
	for _, f := range o.varFiles {
		status = append(status, "-var-file", f)
	}
	if o.hostOverride != "" {
		status = append(status, "--host-override", o.hostOverride)
	}
	return fmt.Errorf("%w: %s holds the state dir %s, and %s. To change the host, edit the plan it runs: it reloads at once (or run %s). "+
		"`%s` shows what it observes. To %s by hand, stop it first (%s)",
		ErrDaemonHolds, who, filepath.Dir(le.Path), what, reload, shellJoin(status), cmd, stop)
}

// systemdUnit returns the systemd service pid runs in ("agent.service"), from its
// cgroup; "" when it runs in none (started from a shell, a test) or pid is gone.
func systemdUnit(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	return unitOfCgroup(string(b))
}

// unitOfCgroup reads the service out of a /proc/PID/cgroup file: the systemd hierarchy's
// path ("0::/system.slice/agent.service" with cgroup v2, "1:name=systemd:/…" with v1).
func unitOfCgroup(cgroup string) string {
	for _, line := range strings.Split(strings.TrimSpace(cgroup), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || (f[1] != "" && f[1] != "name=systemd") {
			continue
		}
		for _, el := range strings.Split(f[2], "/") {
			if strings.HasSuffix(el, ".service") {
				return el
			}
		}
	}
	return ""
}

// shellJoin writes argv as a shell command line: arguments with characters the shell
// would read are single-quoted.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = a
		if a == "" || strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-./=:,@%+", r))
		}) >= 0 {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}
