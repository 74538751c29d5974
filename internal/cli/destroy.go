package cli

import (
	"context"
	"io"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/view"
)

// destroy is `agent destroy PLAN`: everything the plan manages (and every orphan) is
// stopped and removed, dependents first, each step verified as apply verifies it; a
// kind the agent never removes (nvidia_driver) is kept and says so. Exit codes as apply:
// 0 done, 1 a step failed.
func destroy(ctx context.Context, eng *agent.Engine, red *view.Redactor, human *view.View, asJSON bool, stdout io.Writer) int {
	var onEvent func(agent.Event)
	if !asJSON {
		onEvent = human.ApplyEvent
	}
	rep := eng.Destroy(ctx, onEvent)
	if asJSON {
		view.WriteJSON(stdout, view.JSON("destroy", rep, red))
	} else {
		human.DestroySummary(rep)
	}
	if rep.Failed() {
		return ExitError
	}
	return ExitOK
}
