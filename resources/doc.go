// Package resources holds the resource kinds a plan can declare, one kind per file:
// file (file.go), and the kinds that build on internal/ (download, container, server,
// nvidia_driver) as they land. Kinds returns them all for the engine and the plan loader.
package resources

import "github.com/agent-dev/agent/agent"

// Kinds returns every resource kind built into the agent.
func Kinds() []agent.Kind {
	return []agent.Kind{
		FileKind(),
	}
}
