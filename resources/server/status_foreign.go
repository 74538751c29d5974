package server

import (
	"context"
	"fmt"

	"github.com/agent-dev/agent/agent"
)

// unlaunchedStatus is the status of a server the agent has not launched (nothing
// recorded): it also names what holds the server's port, since that is what an apply
// would run into (a process to adopt, or a foreign one it stops only with takeover).
func (s *Server) unlaunchedStatus(ctx context.Context, env *agent.Env) *agent.Status {
	st := &agent.Status{Healthy: false, Summary: "not launched by this agent yet"}
	if s.port == 0 {
		return st
	}
	lc, err := s.lifecycle(ctx)
	if err != nil || lc == nil {
		return st
	}
	procs := lc.Place.Procs(ctx)
	owner, err := s.portHolder(ctx, procs, nil)
	if err != nil || owner == nil {
		return st
	}
	holder := *owner
	if s.matches(ctx, procs, &holder) {
		st.Summary = fmt.Sprintf("not launched by this agent yet; port %d is held by pid %d, which runs this server's command line (the next plan adopts it)", s.port, holder.PID)
		return st
	}
	st.Summary = fmt.Sprintf("not launched by this agent yet; port %d is held by a process it did not start", s.port)
	st.Fields = append(st.Fields, agent.TextField("port_holder", "port holder", describeProc(ctx, procs, owner.PID)))
	if s.takeover {
		st.Fields = append(st.Fields, agent.BoolField("takeover", "takeover", true).WithText("true: apply stops it, verified, then launches this server"))
	} else {
		st.Fields = append(st.Fields, agent.BoolField("takeover", "takeover", false).WithText("false: left alone; apply fails until it is stopped (or takeover = true)"))
	}
	return st
}
