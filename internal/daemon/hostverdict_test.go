package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/view"
)

// After a reboot, a host's verification fails (FinishHost records it, the host group
// stops) only for what will not fix itself: a server that failed, a driver that
// converged still not the wanted one; a server still starting, a wait for a permit, or a
// dependency on its way is not a failure. A backoff's countdown is left out of the text,
// so the same failure reads the same at every pass, and a secret is redacted.
func TestHostVerdictTellsFailedFromOnItsWay(t *testing.T) {
	t.Parallel()
	red := view.NewRedactor([]string{"hunter22"})
	onItsWay := []*agent.Step{
		{Addr: "server.qwen", Status: &agent.Status{Summary: "starting: weights loaded"}},
		{Addr: "server.llama", Err: &WaitingError{Dep: "download.m"}},
		{Addr: "nvidia_driver.host", Err: fmt.Errorf("driver: the fleet's host permit: %w", &coord.HostRefusal{Group: "gpu-hosts", Max: 1})},
	}
	err := hostVerdict(&agent.Report{Steps: onItsWay}, red)
	var vf *fleet.VerifyFailure
	if err == nil || errors.As(err, &vf) || !strings.Contains(err.Error(), "server.qwen: not verified healthy yet") {
		t.Fatalf("on its way: %v", err)
	}
	crashed := &agent.Step{Addr: "server.qwen", Err: fmt.Errorf("server.qwen: %w (2 failures, next try in 3.2s): last error: server.qwen: exited with status 1: token hunter22 refused", ErrBackoff)}
	err = hostVerdict(&agent.Report{Steps: append(onItsWay[1:], crashed)}, red)
	if !errors.As(err, &vf) || err.Error() != "server.qwen: exited with status 1: token (sensitive) refused" {
		t.Fatalf("a server that failed: %v", err)
	}
	crashed.Err = fmt.Errorf("server.qwen: %w (3 failures, next try in 6.4s): last error: server.qwen: exited with status 1: token hunter22 refused", ErrBackoff)
	if again := hostVerdict(&agent.Report{Steps: []*agent.Step{crashed}}, red); again == nil || again.Error() != err.Error() {
		t.Fatalf("the same failure reads %q, then %q", err, again)
	}
	warn := "reboot required: installed 590.48.01, loaded 580.95.05, although the agent rebooted the host at 10:04 for it: the reboot did not help"
	driver := &agent.Step{Addr: "nvidia_driver.host", Diff: &agent.Diff{Action: agent.NoOp, Warnings: []string{warn}}, Status: &agent.Status{Summary: warn}}
	if err := hostVerdict(&agent.Report{Steps: []*agent.Step{driver}}, red); !errors.As(err, &vf) || !strings.Contains(err.Error(), "nvidia_driver.host: reboot required") {
		t.Fatalf("a driver still not the wanted one: %v", err)
	}
	driver.Status.Healthy = true
	if err := hostVerdict(&agent.Report{Steps: []*agent.Step{driver}}, red); err != nil {
		t.Fatalf("verified: %v", err)
	}
}
