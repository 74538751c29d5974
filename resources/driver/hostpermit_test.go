package driver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// gateRecorder is a HostDisruption that records each call with the commands run before it.
type gateRecorder struct {
	mu       sync.Mutex
	run      *fakeRunner
	calls    []string
	failures []string
	refuse   error
}

func (g *gateRecorder) Failed(_ context.Context, step string, err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.failures = append(g.failures, step+": "+err.Error())
	return nil
}

func (g *gateRecorder) Begin(_ context.Context, cause, detail string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, fmt.Sprintf("begin %s (%s) after %q", cause, detail, g.run.ran()))
	return g.refuse
}

func (g *gateRecorder) Rebooting(_ context.Context, cause, detail, bootID string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, fmt.Sprintf("rebooting %s from %s after %q", cause, bootID, g.run.ran()))
	return g.refuse
}

// With coordination, a driver replace takes the host permit before it stops anything, and
// the reboot is recorded in it before systemctl reboot; a refusal changes nothing.
func TestDriverTakesTheHostPermitFirst(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, tree570, run)
	gate := &gateRecorder{run: run}
	h.HostDisruption = gate
	in := serveInstaller(t, h.Root, false, 0)
	e := driverEngine(t, h, in.plan(`  reboot = "allowed"
`))
	st := oneStep(t, e.Apply(context.Background(), nil))
	if st.Err != nil {
		t.Fatalf("apply: %v", st.Err)
	}
	want := []string{
		`begin driver (driver 570.172.08 → 580.95.05) after []`,
		`rebooting reboot from 5d1f2a3c-0000-4000-8000-000000000001 after ["installer"]`,
	}
	if len(gate.calls) != 2 || gate.calls[0] != want[0] || !strings.HasPrefix(gate.calls[1], "rebooting reboot from ") ||
		!strings.HasSuffix(gate.calls[1], `after ["installer"]`) {
		t.Fatalf("host permit calls %q, want %q", gate.calls, want)
	}
	if got := run.ran(); !slices.Equal(got, []string{"installer", "systemctl reboot"}) {
		t.Fatalf("commands %q", got)
	}

	// Refused: the host group's permit is held elsewhere; nothing runs.
	run2 := &fakeRunner{}
	h2 := driverHost(t, tree570, run2)
	refusal := errors.New("host group gpu-hosts: 1 of 1 host permits held: kpro6 rebooting since 10:04 (driver 570.172.08 → 580.95.05)")
	h2.HostDisruption = &gateRecorder{run: run2, refuse: refusal}
	e2 := driverEngine(t, h2, serveInstaller(t, h2.Root, false, 0).plan(`  reboot = "allowed"
`))
	st = oneStep(t, e2.Apply(context.Background(), nil))
	if !errors.Is(st.Err, refusal) || !strings.Contains(st.Err.Error(), "kpro6 rebooting since") {
		t.Fatalf("apply while the permit is held elsewhere: %v", st.Err)
	}
	if got := run2.ran(); len(got) != 0 {
		t.Fatalf("commands %q run without the host permit", got)
	}
}

// An agent killed between recording its reboot and systemctl reboot: the agent started
// again in the same boot asks for the reboot again (the host permit records it again),
// once per agent start; in another boot nothing is asked again for the same cause.
func TestRestartedAgentAsksForTheMissedReboot(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, tree570, run)
	gate := &gateRecorder{run: run}
	h.HostDisruption = gate
	src := serveInstaller(t, h.Root, false, 0).plan(`  reboot = "allowed"
`)
	store := restest.OpenStore(t, filepath.Join(h.StateDir, "state"))
	start := func(agentStart string) *agent.Engine {
		hh := h
		hh.AgentStart = agentStart
		kinds := []agent.Kind{DriverKind(hh)}
		return restest.Engine(t, t.TempDir(), src, kinds, store, agent.Options{})
	}
	ctx := context.Background()
	// The first agent dies as systemctl reboot starts: its record says it asked.
	run.handle = func(c resources.Command) ([]byte, error) {
		if c.Name == "systemctl" {
			return nil, errors.New("signal: killed")
		}
		return nil, nil
	}
	oneStep(t, start("100@5000").Apply(ctx, nil))
	run.mu.Lock()
	run.handle = nil
	run.mu.Unlock()
	if got := run.ran(); !slices.Equal(got, []string{"installer", "systemctl reboot"}) {
		t.Fatalf("first agent's commands %q", got)
	}

	second := start("200@9000")
	st := oneStep(t, second.Plan(ctx))
	if st.Diff.Action == agent.NoOp {
		t.Fatalf("a restarted agent in the same boot plans no reboot: %+v", st.Diff)
	}
	// Its first try finds no etcd lease yet: nothing is recorded, the next try asks.
	gate.refuse = errors.New("no live etcd lease")
	if st = oneStep(t, second.Apply(ctx, nil)); st.Err == nil || len(run.ran()) != 2 {
		t.Fatalf("apply without the host permit: %v, commands %q", st.Err, run.ran())
	}
	gate.refuse = nil
	st = oneStep(t, second.Apply(ctx, nil))
	if st.Err != nil {
		t.Fatalf("restarted agent's apply: %v", st.Err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"installer", "systemctl reboot", "systemctl reboot"}) {
		t.Fatalf("commands %q: the restarted agent did not ask for the reboot again (or installed again)", got)
	}
	if n := len(gate.calls); n != 4 || !strings.HasPrefix(gate.calls[3], "rebooting reboot from 5d1f2a3c-0000-4000-8000-000000000001") {
		t.Fatalf("host permit calls %q: the second reboot is not recorded in the permit", gate.calls)
	}
	// The same agent never asks twice in one boot.
	st = oneStep(t, second.Apply(ctx, nil))
	if got := run.ran(); len(got) != 3 || !hasString(st.Diff.Warnings, "has not gone down yet") {
		t.Fatalf("commands %q, warnings %q: the restarted agent asked twice", got, st.Diff.Warnings)
	}
	// Another boot with the old module still loaded: no reboot for the same cause, by any agent.
	writeTree(t, h.Root, "-- proc/sys/kernel/random/boot_id --\n5d1f2a3c-0000-4000-8000-000000000002\n")
	st = oneStep(t, start("300@100").Apply(ctx, nil))
	if got := run.ran(); len(got) != 3 || !hasString(st.Diff.Warnings, "the reboot did not help") {
		t.Fatalf("commands %q, warnings %q after a reboot that did not help", got, st.Diff.Warnings)
	}
}

// A driver replace whose installer fails records the failed step in the host permit (the
// host group stops fleet-wide until this host is verified) and asks for no reboot; a
// systemctl reboot that fails is recorded as the reboot step.
func TestFailedStepsAreRecordedInTheHostPermit(t *testing.T) {
	t.Parallel()
	run := &fakeRunner{}
	h := driverHost(t, tree570, run)
	gate := &gateRecorder{run: run}
	h.HostDisruption = gate
	e := driverEngine(t, h, serveInstaller(t, h.Root, false, 1).plan(`  reboot = "allowed"
`))
	st := oneStep(t, e.Apply(context.Background(), nil))
	if st.Err == nil || !strings.Contains(st.Err.Error(), "failed") {
		t.Fatalf("apply with a failing installer: %v", st.Err)
	}
	if len(gate.failures) != 1 || !strings.HasPrefix(gate.failures[0], "install: ") || !strings.Contains(st.Err.Error(), strings.TrimPrefix(gate.failures[0], "install: ")) ||
		!strings.Contains(gate.failures[0], "Unable to build the NVIDIA kernel module") {
		t.Fatalf("failures recorded %q, want the install step quoting %q", gate.failures, st.Err)
	}
	if got := run.ran(); !slices.Equal(got, []string{"installer"}) || len(gate.calls) != 1 {
		t.Fatalf("commands %q, host permit calls %q after a failed install", got, gate.calls)
	}

	run2 := &fakeRunner{handle: func(c resources.Command) ([]byte, error) {
		if c.Name == "systemctl" {
			return []byte("Failed to reboot: Access denied"), errors.New("exit status 1")
		}
		return nil, nil
	}}
	h2 := driverHost(t, tree570, run2)
	gate2 := &gateRecorder{run: run2}
	h2.HostDisruption = gate2
	st = oneStep(t, driverEngine(t, h2, serveInstaller(t, h2.Root, false, 0).plan(`  reboot = "allowed"
`)).Apply(context.Background(), nil))
	if st.Err == nil || len(gate2.failures) != 1 || !strings.HasPrefix(gate2.failures[0], "reboot: ") || !strings.Contains(gate2.failures[0], "Access denied") {
		t.Fatalf("a failed systemctl reboot: %v, failures recorded %q", st.Err, gate2.failures)
	}
}
