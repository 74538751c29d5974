package server

import (
	"context"
	"time"

	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/resources"
)

// incusMember is the cluster member holding the container a server runs in, for its
// status (and the member label of its metrics); "" outside a cluster or when the
// instance cannot be read (the status says why elsewhere).
func incusMember(ctx context.Context, lc *lifecycle.Lifecycle) string {
	r, ok := lc.Place.(*lifecycle.Incus)
	if !ok || r.Client == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	inst, _, err := r.Client.GetInstance(ctx, r.Instance)
	if err != nil {
		return ""
	}
	return resources.InstanceMember(inst)
}
