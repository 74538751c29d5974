package resources

import (
	"strings"

	"github.com/agent-dev/agent/agent"
)

// eachRecord calls fn with every record of the state directory whose address starts with
// prefix ("server.", "container."), decoded as T, until fn returns false. Records that
// cannot be read are passed over. It reports false when the records could not be listed:
// the caller then does not know, and must choose the safe answer itself.
func eachRecord[T any](env *agent.Env, prefix string, fn func(addr string, rec T) bool) bool {
	peers, err := env.State.Peers()
	if err != nil {
		return false
	}
	for _, addr := range peers {
		if !strings.HasPrefix(addr, prefix) {
			continue
		}
		var rec T
		if ok, err := env.State.Peer(addr).Load(&rec); err != nil || !ok {
			continue
		}
		if !fn(addr, rec) {
			break
		}
	}
	return true
}
