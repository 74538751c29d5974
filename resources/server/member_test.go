package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// A server in a container on a cluster member whose incusd hangs (SIGSTOP) is observed
// in the cluster's own words once the cluster marks the member Offline, at once: every
// look inside is forwarded to that member, which answers none, so before this its plan
// and status waited out the remote looks' deadlines and ended in "context deadline
// exceeded" (issue 27's point 7 fixed the container kind alone). The member, its status
// and the fix are in the plan's error and the status, which is not healthy and names the
// member; neither waits as long as one look inside may (lifecycle's 10 s). The server's
// watch returns within seconds of the member going Offline, as the container's does.
func TestServerInContainerOnAHungMember(t *testing.T) {
	c := incusCluster.Start(t)
	// Through m1's socket: the instance on m2 is reached through the cluster.
	h, on := onMember2(t, c, c.Socket, resources.Machine{GPU: restest.A6000})
	engine := func(vars ...string) *agent.Engine { return on(resources.Machine{GPU: restest.A6000}, vars...) }
	ctx := context.Background()
	mustOK(t, h.step(engine().Apply(ctx, nil)))
	if st := h.step(engine().Status(ctx)); st.Err != nil || !st.Status.Healthy || st.Status.Member() != "m2" {
		t.Fatalf("status before: %v %+v", st.Err, st.Status)
	}

	// The server's watch: quiet while m2 answers, back within seconds of the cluster
	// marking it Offline (its process inside still runs and its probe still answers:
	// only the member tells), so that agent run observes it at once.
	returned := restest.QuietWatch(t, engine(), "server.qwen")

	// A status begun right after the freeze, while the cluster still reports m2 Online,
	// ends with the cluster's word within seconds of m2 reading Offline (its reads
	// forwarded to m2 are abandoned: incus.WhileOnline), not when m2 is back.
	c.Freeze(t, "m2") // thawed, and back, when the test ends
	early := make(chan *agent.Step, 1)
	go func() { early <- h.step(engine().Status(ctx)) }()
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer wcancel()
	if err := c.WaitMembers(wctx, incus.MemberOffline, "m2"); err != nil {
		t.Fatal(err)
	}
	offline := time.Now()
	returned(offline)
	const fast = 10 * time.Second // one look inside may take this long (lifecycle's default)
	words := func(s string) bool {
		return strings.Contains(s, "member m2 is Offline") && strings.Contains(s, "incus cluster list") && strings.Contains(s, h.name)
	}
	select {
	case st := <-early:
		if st.Err != nil || st.Status == nil || st.Status.Healthy || !words(st.Status.Summary) {
			t.Errorf("status begun before m2 read Offline: %v %+v", st.Err, st.Status)
		}
	case <-time.After(time.Until(offline.Add(5 * time.Second))):
		t.Errorf("a status begun before m2 read Offline still waits 5 s after it did")
	}

	began := time.Now()
	st := h.step(engine().Status(ctx))
	took := time.Since(began)
	if st.Err != nil || st.Status == nil || st.Status.Healthy || !words(st.Status.Summary) || st.Status.Member() != "m2" {
		t.Errorf("status with m2 hung: %v %+v", st.Err, st.Status)
	}
	if took >= fast {
		t.Errorf("status with m2 hung took %s, want under %s", took.Round(time.Millisecond), fast)
	}
	t.Logf("status with m2 hung: %s: %s", took.Round(time.Millisecond), st.Status.Summary)

	began = time.Now()
	st = h.step(engine().Plan(ctx))
	took = time.Since(began)
	if st.Err == nil || !words(st.Err.Error()) {
		t.Errorf("plan with m2 hung: %v %+v", st.Err, st.Diff)
	}
	if took >= fast {
		t.Errorf("plan with m2 hung took %s, want under %s", took.Round(time.Millisecond), fast)
	}
	t.Logf("plan with m2 hung: %s: %v", took.Round(time.Millisecond), st.Err)
}
