package cli

import (
	"context"
	"io"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/plans"
)

// destroy is `agent destroy PLAN`: everything the plan manages (and every orphan) is
// stopped and removed, dependents first, each step verified as apply verifies it; a
// kind the agent never removes (nvidia_driver) is kept and says so. Exit codes as apply:
// 0 done, 1 a step failed.
func destroy(ctx context.Context, eng *agent.Engine, p *plans.Plan, red *agent.Redactor, view *agent.View, asJSON bool, stdout io.Writer) int {
	var onEvent func(agent.Event)
	if !asJSON {
		onEvent = view.ApplyEvent
	}
	rep := eng.Destroy(ctx, onEvent)
	if asJSON {
		agent.WriteJSON(stdout, agent.JSON("destroy", rep, p, red))
	} else {
		view.DestroySummary(rep)
	}
	if rep.Failed() {
		return ExitError
	}
	return ExitOK
}
