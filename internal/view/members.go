package view

import (
	"sort"
	"strings"

	"github.com/agent-dev/agent/agent"
)

// members prints, after the status of a plan whose resources live on cluster members
// (Status.Member), one line per member with its resources and their health: the fleet
// view of a cluster plan. A plan without members prints nothing more.
func (v *View) members(rep *agent.Report) {
	byMember := map[string][]string{}
	for _, st := range rep.Steps {
		if st.Err != nil || st.Status == nil {
			continue
		}
		m := st.Status.Member()
		if m == "" {
			continue
		}
		mark := "✓"
		if !st.Status.Healthy {
			mark = "!"
		}
		byMember[m] = append(byMember[m], mark+" "+st.Addr)
	}
	if len(byMember) == 0 {
		return
	}
	names := make([]string, 0, len(byMember))
	for m := range byMember {
		names = append(names, m)
	}
	sort.Strings(names)
	v.printf("\nMembers:\n")
	for _, m := range names {
		v.printf("  %s: %s\n", m, strings.Join(byMember[m], ", "))
	}
}
