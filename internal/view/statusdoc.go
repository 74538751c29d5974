package view

import (
	"errors"

	"github.com/agent-dev/agent/agent"
)

// StatusReport is the report a status document describes: `agent run` answers /status
// with one, and `agent status` renders it with View.Status, the code path of a status it
// observes itself, so that both read the same (aligned columns, members, marks). Errors
// come back as the document's (already redacted) messages.
func StatusReport(doc *JSONOutput) *agent.Report {
	rep := &agent.Report{}
	for _, r := range doc.Resources {
		st := &agent.Step{Addr: r.Address, Status: r.Status, Orphan: r.Orphan, MovedFrom: r.MovedFrom}
		if r.Error != "" {
			st.Err = errors.New(r.Error)
		} else if st.Status == nil {
			// Not in a document `agent run` writes (it says "not observed yet"), but a
			// resource without a status is not healthy.
			st.Status = &agent.Status{Summary: "no status"}
		}
		rep.Steps = append(rep.Steps, st)
	}
	return rep
}
