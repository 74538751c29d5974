package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"

	"github.com/agent-dev/agent/internal/proc"
)

// Servers on a host whose init is systemd run in transient services of their own
// ("agent-server-NAME-GEN-….service", started through systemd's D-Bus API), not in the
// agent's process tree: their own cgroup, accounting and stop, so that agent.service's
// restarts, `systemctl kill agent` and KillMode never touch them, and systemd reports no
// "left-over process" at each agent restart. Where systemd is not PID 1 (test machines,
// minimal containers), servers run as children in a session of their own, as before.

// UnitPrefix starts the name of every server's transient unit.
const UnitPrefix = "agent-server-"

// systemdRuns reports whether systemd is the init system (sd_booted(3)), and so whether
// Local.Start launches servers in transient units. AGENT_NO_SYSTEMD_UNITS=1 turns it off.
func systemdRuns() bool {
	if os.Getenv("AGENT_NO_SYSTEMD_UNITS") == "1" {
		return false
	}
	fi, err := os.Lstat("/run/systemd/system")
	return err == nil && fi.IsDir()
}

// ServersInUnits reports whether servers launched on this host go to transient systemd
// units of their own (where systemd's API answers; else they run as the agent's
// children): the reconcile loop's start line says which.
func ServersInUnits() bool { return systemdRuns() }

// unitName is a server generation's transient unit: unique per launch, readable in
// `systemctl list-units 'agent-server-*'`.
func unitName(log LogFile, now time.Time) string {
	var b strings.Builder
	for _, r := range log.Name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return fmt.Sprintf("%s%s-%d-%x.service", UnitPrefix, b.String(), log.Generation, now.UnixNano())
}

// UnitOf returns the server unit whose cgroup holds pid ("" when none): the proof, from
// the kernel's own bookkeeping, that a process belongs to a server's unit.
func UnitOf(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return ""
	}
	return unitInCgroup(string(data))
}

// unitInCgroup is UnitOf on the text of /proc/PID/cgroup.
func unitInCgroup(data string) string {
	for _, line := range strings.Split(data, "\n") {
		// "0::/system.slice/agent-server-qwen-3-….service" (v2), or the name=systemd
		// hierarchy of a hybrid setup.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || (parts[1] != "" && parts[1] != "name=systemd") {
			continue
		}
		for _, seg := range strings.Split(parts[2], "/") {
			if strings.HasPrefix(seg, UnitPrefix) && strings.HasSuffix(seg, ".service") {
				return seg
			}
		}
	}
	return ""
}

// lookPath resolves argv[0] in the PATH of the server's environment: systemd needs an
// absolute ExecStart, and the server's PATH, not the agent's, decides which program.
func lookPath(argv0 string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	path := DefaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, argv0)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %s", argv0, path)
}

// startUnit runs s in a new transient service and returns its main PID. Its output is
// appended to logPath, which the caller has created. The unit is garbage-collected by
// systemd once its processes are gone (CollectMode=inactive-or-failed).
func startUnit(ctx context.Context, s Spec, logPath string, now time.Time, log LogFile) (pid int, unit string, err error) {
	env := s.Environ()
	exe, err := lookPath(s.Argv[0], env)
	if err != nil {
		return 0, "", err
	}
	dir := s.Workdir
	if dir == "" {
		dir = "/"
	}
	unit = unitName(log, now)
	props := []sddbus.Property{
		sddbus.PropDescription("agent server " + log.Name + " generation " + strconv.Itoa(log.Generation)),
		sddbus.PropType("exec"), // the start job fails when the exec fails
		// ExecStart's argv[0] is the program, then the whole argv as the process sees it.
		{Name: "ExecStart", Value: dbus.MakeVariant([]execStart{{Path: exe, Args: append([]string{s.Argv[0]}, s.Argv[1:]...)}})},
		{Name: "Environment", Value: dbus.MakeVariant(env)},
		{Name: "WorkingDirectory", Value: dbus.MakeVariant(dir)},
		{Name: "StandardInput", Value: dbus.MakeVariant("null")},
		{Name: "StandardOutputFileToAppend", Value: dbus.MakeVariant(logPath)},
		{Name: "StandardErrorFileToAppend", Value: dbus.MakeVariant(logPath)},
		{Name: "CollectMode", Value: dbus.MakeVariant("inactive-or-failed")},
		// The agent stops servers itself (signal, timeout, verified); systemd ends what
		// is left in the cgroup once the main process is gone.
		{Name: "KillMode", Value: dbus.MakeVariant("control-group")},
	}
	if s.User != "" {
		props = append(props, sddbus.Property{Name: "User", Value: dbus.MakeVariant(s.User)})
	}
	conn, err := sddbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return 0, "", fmt.Errorf("%w: connect to systemd: %v", errNoUnit, err)
	}
	defer conn.Close()
	done := make(chan string, 1)
	if _, err := conn.StartTransientUnitContext(ctx, unit, "fail", props, done); err != nil {
		return 0, "", fmt.Errorf("start transient unit %s: %w", unit, err)
	}
	select {
	case result := <-done:
		if result != "done" {
			return 0, unit, fmt.Errorf("transient unit %s: start job %s (journalctl -u %s)", unit, result, unit)
		}
	case <-ctx.Done():
		return 0, unit, fmt.Errorf("transient unit %s: %w", unit, ctx.Err())
	}
	p, err := conn.GetServicePropertyContext(ctx, unit, "MainPID")
	if err != nil {
		return 0, unit, fmt.Errorf("transient unit %s: main PID: %w", unit, err)
	}
	main, _ := p.Value.Value().(uint32)
	if main == 0 {
		return 0, unit, fmt.Errorf("transient unit %s has no main process: it exited at once (see its log)", unit)
	}
	return int(main), unit, nil
}

// execStart is one ExecStart= entry as systemd's D-Bus API takes it: (sasb).
type execStart struct {
	Path             string
	Args             []string
	UncleanIsFailure bool
}

// errNoUnit is wrapped when systemd could not be asked at all: the caller falls back to
// a child process of its own.
var errNoUnit = errors.New("no transient unit")

// startInUnit is Local.Start's launch through systemd: f is the generation's log file,
// already created. It returns errNoUnit when systemd's API cannot be reached.
func (h Local) startInUnit(ctx context.Context, s Spec, log LogFile, f *os.File) (*Started, error) {
	pid, unit, err := startUnit(ctx, s, f.Name(), time.Now(), log)
	if errors.Is(err, errNoUnit) {
		return nil, err
	}
	if err != nil {
		fmt.Fprintf(f, "agent: could not start %q: %v\n", s.Argv[0], err)
		return nil, fmt.Errorf("start %s: %w", strconv.Quote(s.Argv[0]), err)
	}
	st, err := h.Proc.Stat(pid)
	if err != nil {
		return nil, fmt.Errorf("start: read the new process %d of %s: %w", pid, unit, err)
	}
	// Not our child: no Exited channel; the launch's waits see the exit through /proc.
	started := &Started{ID: st.Identity(), PGID: st.PGRP, SID: st.Session}
	if err := linkCurrent(log.Dir, log.Name, log.Generation); err != nil {
		return started, err
	}
	_ = pruneLogs(log.Dir, log.Name, log.Keep, log.Generation)
	return started, nil
}

// unitOfTarget is the server unit whose cgroup holds the target's leader, when the
// leader is still the recorded process (PID and start time); "" otherwise.
func unitOfTarget(ctx context.Context, procs Procs, t proc.Target) string {
	if t.Leader.PID <= 1 {
		return ""
	}
	if ok, err := procs.Alive(ctx, t.Leader); err != nil || !ok {
		return ""
	}
	return UnitOf(t.Leader.PID)
}

// finishUnit ends what is left of a stopped server's unit: SIGKILL to every process in
// its cgroup (children that left the session and dropped the marker included), then
// waits until systemd reports the unit inactive or gone, which it does only once the
// cgroup is empty. The proof is the kernel's cgroup membership, not a process search.
func finishUnit(ctx context.Context, unit string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := sddbus.NewSystemdConnectionContext(ctx)
	if err != nil {
		return fmt.Errorf("unit %s: connect to systemd: %w", unit, err)
	}
	defer conn.Close()
	if err := conn.KillUnitWithTarget(ctx, unit, sddbus.All, int32(syscall.SIGKILL)); err != nil && !unitGone(err) {
		return fmt.Errorf("unit %s: kill what is left: %w", unit, err)
	}
	for {
		p, err := conn.GetUnitPropertyContext(ctx, unit, "ActiveState")
		if err != nil && unitGone(err) {
			return nil
		}
		if err == nil {
			if st, _ := p.Value.Value().(string); st == "inactive" || st == "failed" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("unit %s still has processes after SIGKILL: %w", unit, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unitGone reports an error saying the unit is not loaded (collected after its stop).
func unitGone(err error) bool {
	var de dbus.Error
	if errors.As(err, &de) {
		return de.Name == "org.freedesktop.systemd1.NoSuchUnit" || de.Name == "org.freedesktop.systemd1.LoadFailed"
	}
	return strings.Contains(err.Error(), "not loaded") || strings.Contains(err.Error(), "NoSuchUnit")
}
