package server

import (
	"context"

	"github.com/agent-dev/agent/internal/lifecycle"
)

// sameUser reports whether the process runs as the server's user (its real and effective
// uid both), the agent's own when the plan names none: a process of another user with
// the plan's exact command line is not adopted (issue 13, 2), or root would later stop it
// on a flag change. Inside a container, uids are the container's mapped ones and the
// user is checked by the container's own launch; there the argv, environment and
// workdir decide.
func (s *Server) sameUser(ctx context.Context, procs lifecycle.Procs, pid int) bool {
	if s.container != "" {
		return true
	}
	want, err := lifecycle.UserID(s.user)
	if err != nil {
		return false
	}
	real, eff, err := procs.UIDs(ctx, pid)
	return err == nil && real == want && eff == want
}
