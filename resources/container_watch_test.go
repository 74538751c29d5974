package resources

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
)

// Issue 27, point 7: a container on a member whose incusd hangs (SIGSTOP) reads as the
// cluster reports it within seconds of the cluster marking the member Offline: its
// Watch returns (so `agent run` observes it at once, not at its next resync: it read
// "✓ running, matches the plan" for 36 s), and its status then says the member is
// Offline, quoting the cluster, and is not healthy.
func TestContainerWatchSeesAHungMember(t *testing.T) {
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)
	h.apply(`  target = "m2"`)
	e := h.engine(`  target = "m2"`)
	if st := e.Status(context.Background()).Steps[0]; st.Err != nil || !st.Status.Healthy {
		t.Fatalf("status before: %v %+v", st.Err, st.Status)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watched := make(chan error, 1)
	go func() { watched <- e.Watch(ctx, "container.c") }()
	select {
	case err := <-watched:
		t.Fatalf("the watch ended before the member hung: %v", err)
	case <-time.After(2 * MemberWatchEvery):
	}

	c.Hang(t, "m2") // Offline in the cluster's view; thawed (and back) when the test ends
	offline := time.Now()
	select {
	case err := <-watched:
		if err != nil {
			t.Fatalf("the watch: %v", err)
		}
		t.Logf("the watch returned %s after the cluster marked m2 Offline", time.Since(offline).Round(time.Millisecond))
	case <-time.After(2*MemberWatchEvery + 5*time.Second):
		t.Fatalf("the watch did not return within %s of the cluster marking m2 Offline", 2*MemberWatchEvery+5*time.Second)
	}
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	st := e.Status(sctx).Steps[0]
	if st.Err != nil || st.Status == nil || st.Status.Healthy || !strings.Contains(st.Status.Summary, "member m2 is Offline") ||
		field(st.Status, agent.MemberField) != "m2" {
		t.Errorf("status with m2 hung: %v %+v", st.Err, st.Status)
	}
}
