package container

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources/restest"
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

	returned := restest.QuietWatch(t, e, "container.c")
	c.Hang(t, "m2") // Offline in the cluster's view; thawed (and back) when the test ends
	returned(time.Now())
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	st := e.Status(sctx).Steps[0]
	if st.Err != nil || st.Status == nil || st.Status.Healthy || !strings.Contains(st.Status.Summary, "member m2 is Offline") ||
		restest.Field(st.Status, agent.MemberField) != "m2" {
		t.Errorf("status with m2 hung: %v %+v", st.Err, st.Status)
	}
}

// A plan or status that began while the member holding the container had just hung,
// and the cluster still reported it Online, ends with the cluster's word on the member
// within seconds of the cluster marking it Offline: the read the cluster forwards to a
// hung member never ends by itself (it waited out the member's whole outage, 84 s), so
// an `agent run` resync that began in that window held the container's reconcile, and
// its watch, until the step's deadline (issue 26's CI run, TestHungMemberQuietUnderRun).
func TestAReadInFlightEndsWhenItsMemberGoesOffline(t *testing.T) {
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)
	h.apply(`  target = "m2"`)
	e := h.engine(`  target = "m2"`)

	c.Freeze(t, "m2") // thawed, and back, when the test ends
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type ended struct {
		what string
		err  error
		st   *agent.Status
		at   time.Time
	}
	results := make(chan ended, 2)
	go func() {
		st := e.Plan(ctx).Steps[0]
		results <- ended{"plan", st.Err, nil, time.Now()}
	}()
	go func() {
		st := e.Status(ctx).Steps[0]
		results <- ended{"status", st.Err, st.Status, time.Now()}
	}()
	if err := c.WaitMembers(ctx, incus.MemberOffline, "m2"); err != nil {
		t.Fatal(err)
	}
	offline := time.Now()
	const within = 5 * time.Second // memberGuardEvery, and the cluster's answer, with room
	for range 2 {
		select {
		case r := <-results:
			t.Logf("%s ended %s after the cluster reported m2 Offline", r.what, r.at.Sub(offline).Round(time.Millisecond))
			switch r.what {
			case "plan":
				if r.err == nil || !agent.IsUnavailable(r.err) || !strings.Contains(r.err.Error(), "member m2 is Offline") {
					t.Errorf("plan: %v, want the member's being Offline (Unavailable)", r.err)
				}
			case "status":
				if r.err != nil || r.st == nil || r.st.Healthy || !strings.Contains(r.st.Summary, "member m2 is Offline") || restest.Field(r.st, agent.MemberField) != "m2" {
					t.Errorf("status: %v %+v, want m2 Offline", r.err, r.st)
				}
			}
		case <-time.After(time.Until(offline.Add(within))):
			t.Fatalf("a plan or status begun before m2 read Offline still waits %s after it did", within)
		}
	}
}
