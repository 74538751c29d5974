package resources

import (
	"strings"
)

// HasDotDot reports whether a path has a ".." element. Paths in a plan say where the agent
// writes as root; one with ".." is refused rather than cleaned, so that what the plan
// shows is where things land (issue 13, 9).
func HasDotDot(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}
