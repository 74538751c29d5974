package resources

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
)

// Command is one host command a resource runs: the driver installer, the package
// manager, nvidia-smi, modprobe, systemctl reboot.
type Command struct {
	Name string
	Args []string
	// Env is added to the agent's environment (DEBIAN_FRONTEND=noninteractive).
	Env []string
	// Log, when set, receives stdout and stderr as they come, and Run returns no output.
	Log io.Writer
}

func (c Command) String() string { return strings.Join(append([]string{c.Name}, c.Args...), " ") }

// CommandRunner runs host commands (not to be mistaken for the place a server's
// processes run in, lifecycle's). Tests replace it with a recorder, so no test ever runs
// a real installer, package manager, modprobe or reboot.
type CommandRunner interface {
	// Run runs c to completion and returns its combined output (nil when c.Log is set).
	// A non-zero exit is an error.
	Run(ctx context.Context, c Command) ([]byte, error)
}

// ExecRunner runs commands with os/exec: what the agent does on a real host.
type ExecRunner struct{}

// Run implements CommandRunner.
func (ExecRunner) Run(ctx context.Context, c Command) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Name, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdin = nil
	var out bytes.Buffer
	if c.Log != nil {
		cmd.Stdout, cmd.Stderr = c.Log, c.Log
	} else {
		cmd.Stdout, cmd.Stderr = &out, &out
	}
	err := cmd.Run()
	if c.Log != nil {
		return nil, err
	}
	return out.Bytes(), err
}

// ProcessStart names this process among every process of this boot: its PID and its
// start time in clock ticks since boot, which a later process with the same PID cannot
// share. "" when /proc cannot be read.
func ProcessStart() string {
	id, err := proc.FS{}.Identify(os.Getpid())
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d@%d", id.PID, id.StartTicks)
}

// ErrCommandsDisabled is returned by the runner of a host whose root was moved with
// AGENT_HOST_ROOT: commands would act on the real machine, not on that root.
var ErrCommandsDisabled = errors.New("host commands are disabled: AGENT_HOST_ROOT points the agent at a fake root")

type refusingRunner struct{}

func (refusingRunner) Run(_ context.Context, c Command) ([]byte, error) {
	return nil, fmt.Errorf("%s: %w", c.Name, ErrCommandsDisabled)
}

// GPUServerStopper is the hook a driver change uses to stop the servers that use the
// GPUs. The server resource implements it and is wired into Machine.StopGPUServers; the
// nvidia_driver resource calls it before an installer or a package replaces a loaded
// driver, then verifies with NVML (gpu.WaitReleased) that no process holds GPU memory.
type GPUServerStopper interface {
	// StopGPUServers stops, with the server resource's verified kill, every server the
	// agent manages that holds GPU memory: gpuPIDs are the compute processes NVML lists
	// (host PIDs). It must not signal a process the agent did not start unless its server
	// says takeover = true, and returns when its servers are proven gone or ctx ends.
	// reason is for its logs ("nvidia_driver.host: driver 570.x → 580.95.05").
	// Processes it leaves running make the driver change fail, naming them.
	// records are the state's records, read-only (the driver's Scoped.Others): the
	// servers' are there (resources/peers.go, serverRecords). gpuPIDs nil stops every
	// server of the records, GPU or not (agent drain).
	StopGPUServers(ctx context.Context, records *state.View, gpuPIDs []int, reason string) error
}

// HostDisruption is the hook of a disruption of the whole host (a driver replace, the
// reboot after it) in a fleet: its host permit (internal/fleet.HostGate implements it;
// docs/fleet.md "Host disruptions"). Nil, or a gate without coordination, asks nothing.
type HostDisruption interface {
	// Begin takes this host's host permit for cause ("driver", "reboot") and detail
	// ("driver 580.95.05 → 590.48.01") before the first server stops; a permit the host
	// holds already is kept. An error (a refusal names the holder) refuses the disruption.
	Begin(ctx context.Context, cause, detail string) error
	// Rebooting records in the permit (taken first if need be) that the host reboots
	// from boot bootID, before the reboot is asked for: the permit is released at boot,
	// in another boot, once the driver and the servers are verified.
	Rebooting(ctx context.Context, cause, detail, bootID string) error
	// Failed records in the permit that step ("stop", "install", "reboot") of the
	// disruption failed with err: the host group stops fleet-wide (no other host
	// begins) until this host is verified again or an operator frees its permit. A
	// host that holds no permit records nothing; the same failure again writes nothing.
	Failed(ctx context.Context, step string, err error) error
}

// HostRootEnv names the environment variable that moves the host's root for
// observation: `AGENT_HOST_ROOT=/tmp/fake agent status plan.hcl` reads the driver's
// /proc, /sys and library files under /tmp/fake, observes GPUs through those files only
// (never NVML, which sees the real machine), and refuses to run host commands. It exists
// for tests and for inspecting a copied tree; production never sets it.
const HostRootEnv = "AGENT_HOST_ROOT"

// HostFromEnv is the host Kinds acts on: the real machine, or the fake root that
// AGENT_HOST_ROOT names.
func HostFromEnv(getenv func(string) string) Machine {
	root := getenv(HostRootEnv)
	if root == "" {
		return Machine{}
	}
	var run CommandRunner = refusingRunner{}
	if prog := getenv(HostRunnerEnv); prog != "" {
		run = programRunner{prog: prog}
	}
	return Machine{Root: root, GPU: gpu.ProcFS{Root: root}, Run: run}
}

// HostRunnerEnv names, beside AGENT_HOST_ROOT only, a program that runs the fake root's
// host commands in their place: `PROGRAM NAME ARGS...` (the installer, nvidia-smi,
// systemctl reboot). The fleet tests' reboot hook is one; without it the fake root's
// commands are refused.
const HostRunnerEnv = "AGENT_HOST_RUNNER"

// programRunner runs each host command as `prog NAME ARGS...`.
type programRunner struct{ prog string }

func (p programRunner) Run(ctx context.Context, c Command) ([]byte, error) {
	c.Args = append([]string{c.Name}, c.Args...)
	c.Name = p.prog
	return ExecRunner{}.Run(ctx, c)
}
