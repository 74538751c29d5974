package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fleet"
	"github.com/agent-dev/agent/internal/view"
)

// agent run's part of a host's verification (fleet.Judge holds the rest, TestJudge): a
// dependency on its way (a WaitingError) is not a failure; a server in backoff is, quoted
// by its last error without the countdown, so the same failure reads the same at every
// pass (and is recorded once), redacted.
func TestHostVerdictTellsFailedFromOnItsWay(t *testing.T) {
	t.Parallel()
	red := view.NewRedactor([]string{"hunter22"})
	onItsWay := []*agent.Step{
		{Addr: "server.qwen", Status: &agent.Status{Summary: "starting: weights loaded"}},
		{Addr: "server.llama", Err: &WaitingError{Dep: "download.m"}},
	}
	err := hostVerdict(&agent.Report{Steps: onItsWay}, red)
	var vf *fleet.VerifyFailure
	if err == nil || errors.As(err, &vf) || !strings.Contains(err.Error(), "server.llama: waiting for download.m to converge") {
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
}
