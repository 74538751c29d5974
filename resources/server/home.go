package server

import (
	"path/filepath"

	"github.com/agent-dev/agent/agent"
)

// serverHome is the HOME a launch gives the server (lifecycle.Spec.Home): the declared
// `home`; else, for a server on the host under the agent's own user, <state_dir>/home,
// the same whoever launches it (`agent apply` from a shell, or agent.service, which has
// no HOME and a read-only /root); else "" (a `user`'s home from passwd, or the
// container user's home inside the instance).
//
// Only a declared home is part of the identity: the default moving (another state
// directory) relaunches nothing.
func (s *Server) serverHome(env *agent.Env) string {
	if s.home != "" {
		return s.home
	}
	if s.container != "" || s.user != "" || env == nil || env.State == nil {
		return ""
	}
	dir, err := filepath.Abs(env.State.Dir())
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "home")
}
