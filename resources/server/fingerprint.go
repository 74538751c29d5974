package server

import (
	"strconv"

	"github.com/agent-dev/agent/agent"
)

// Facts is what a server's diff was decided from besides its changes: the process its
// record names (PID, start time in clock ticks, generation), so that a saved plan
// refuses a server relaunched or replaced since it was made, and says which process it
// saw (agent.Fingerprinter). Its identity (command line, environment) is in the record,
// whose digest every fingerprint holds, and in the diff's changes.
func (s *Server) Facts(env *agent.Env, d *agent.Diff) []agent.Fact {
	var rec serverRecord
	if has, err := env.State.Load(&rec); err != nil || !has || !rec.StoppedAt.IsZero() {
		return nil
	}
	return []agent.Fact{
		{Name: "pid", Value: strconv.Itoa(rec.PID)},
		{Name: "start_ticks", Value: strconv.FormatUint(rec.StartTicks, 10)},
		{Name: "generation", Value: strconv.Itoa(rec.Generation)},
	}
}
