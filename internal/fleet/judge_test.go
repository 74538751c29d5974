package fleet

import (
	"errors"
	"fmt"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/drain"
	"github.com/agent-dev/agent/internal/view"
)

// Judge tells a host that failed its verification (recorded: the host group stops) from
// one on its way, for every caller: an apply's own report (a server that did not serve
// again), a status after it (a driver that converged still not the wanted one), agent
// run's steps (with its own waits, through quote). Each failure is quoted once,
// addressed and redacted; the waits of any caller (a rollout or host group full, the
// host drained) are never failures.
func TestJudge(t *testing.T) {
	t.Parallel()
	red := view.NewRedactor([]string{"hunter22"})
	healthy := &agent.Step{Addr: "file.cfg", Status: &agent.Status{Healthy: true}}
	exited := func() *agent.Step {
		return &agent.Step{Addr: "server.qwen", Err: errors.New("exited with status 1 before ready: token hunter22 refused")}
	}
	warn := "reboot required: installed 580.95.05, loaded 570.172.08, although the agent rebooted the host at 10:04 for it: the reboot did not help"
	driver := &agent.Step{Addr: "nvidia_driver.host", Diff: &agent.Diff{Action: agent.NoOp, Warnings: []string{warn}}, Status: &agent.Status{Summary: warn}}
	refused := &agent.Step{Addr: "nvidia_driver.host", Err: fmt.Errorf("the fleet's host permit: %w", &coord.HostRefusal{Group: "gpu-hosts", Max: 1})}
	drained := &agent.Step{Addr: "server.llama", Err: fmt.Errorf("server.llama: %w", drain.ErrDrained)}
	starting := &agent.Step{Addr: "server.llama", Status: &agent.Status{Summary: "starting: weights loaded"}}
	custom := &agent.Step{Addr: "server.llama", Err: errors.New("waiting for download.m to converge")}
	ownWait := func(err error) (string, bool) { return "", err.Error() == custom.Err.Error() }

	for _, tc := range []struct {
		name   string
		steps  []*agent.Step
		quote  func(error) (string, bool)
		failed string // the *VerifyFailure's text; "" none
		onWay  string // the plain error's text when not failed; "" verified
	}{
		{name: "verified", steps: []*agent.Step{healthy}},
		{name: "not observed", onWay: "the plan has not been observed yet"},
		{name: "a server that exited, redacted and addressed", steps: []*agent.Step{healthy, exited()},
			failed: "server.qwen: exited with status 1 before ready: token (sensitive) refused"},
		{name: "the same failure twice is quoted once", steps: []*agent.Step{exited(), exited()},
			failed: "server.qwen: exited with status 1 before ready: token (sensitive) refused"},
		{name: "a driver still not the wanted one", steps: []*agent.Step{driver, starting},
			failed: "nvidia_driver.host: " + warn},
		{name: "waits of any caller and a server starting are on their way", steps: []*agent.Step{refused, drained, starting},
			onWay: "nvidia_driver.host: the fleet's host permit: " + (&coord.HostRefusal{Group: "gpu-hosts", Max: 1}).Error() +
				"; server.llama: server.llama: host drained" + "; server.llama: not verified healthy yet"},
		{name: "a caller's own wait", steps: []*agent.Step{custom}, quote: ownWait,
			onWay: "server.llama: waiting for download.m to converge"},
		{name: "without the caller's quote it fails", steps: []*agent.Step{custom},
			failed: "server.llama: waiting for download.m to converge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rep *agent.Report
			if tc.steps != nil {
				rep = &agent.Report{Steps: tc.steps}
			}
			err := Judge(rep, red, tc.quote)
			var vf *VerifyFailure
			switch {
			case tc.failed != "":
				if !errors.As(err, &vf) || err.Error() != tc.failed {
					t.Fatalf("got %v (%T), want the failure %q", err, err, tc.failed)
				}
			case tc.onWay != "":
				if err == nil || errors.As(err, &vf) || err.Error() != tc.onWay {
					t.Fatalf("got %v (%T), want on its way: %q", err, err, tc.onWay)
				}
			case err != nil:
				t.Fatalf("verified: %v", err)
			}
		})
	}
}
