package container

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources/restest"
)

// TestContainerTargetChangeMoves: a stopped instance whose target changes is moved
// (incus move): same name, same instance (uuid), on the new member; the plan shows the
// target change as a migration.
func TestContainerTargetChangeMoves(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)
	h.apply("  target = \"m2\"\n  running = false\n")
	before, _, err := c.Client.GetInstance(context.Background(), h.name)
	if err != nil {
		t.Fatal(err)
	}
	body := "  target = \"m3\"\n  running = false\n"
	p := h.plan(body)
	if p.Err != nil || p.Diff.Action == agent.NoOp {
		t.Fatalf("plan: %v %+v", p.Err, p.Diff)
	}
	var target *agent.Change
	for i, ch := range p.Diff.Changes {
		if ch.Attr == "target" {
			target = &p.Diff.Changes[i]
		}
	}
	if target == nil || target.Old != "m2" || target.New != "m3" || target.Reason != agent.ReasonMigrate || !strings.Contains(target.Note, "incus move") {
		t.Fatalf("target change: %+v", p.Diff.Changes)
	}
	h.apply(body)
	after, _, err := c.Client.GetInstance(context.Background(), h.name)
	if err != nil {
		t.Fatal(err)
	}
	if after.Location != "m3" || after.Config["volatile.uuid"] != before.Config["volatile.uuid"] {
		t.Fatalf("after the move: on %s, uuid %s (was %s)", after.Location, after.Config["volatile.uuid"], before.Config["volatile.uuid"])
	}
	if _, _, err := c.Client.GetInstance(context.Background(), h.name+"-b"); !incus.IsNotFound(err) {
		t.Errorf("a move made a pair instance: %v", err)
	}
	if st := h.status(body); st.Err != nil || st.Status.Member() != "m3" {
		t.Fatalf("status: %v %+v", st.Err, st.Status)
	}

	// Running, with no server of the plan in it: stopped, moved and started again.
	h.apply(`  target = "m3"`)
	p = h.plan(`  target = "m1"`)
	if p.Err != nil || p.Diff.Action != agent.Restart || !strings.Contains(p.Diff.Changes[0].Note, "no server") {
		t.Fatalf("plan of a running instance without servers: %v %+v", p.Err, p.Diff)
	}
	h.apply(`  target = "m1"`)
	moved, _, err := c.Client.GetInstance(context.Background(), h.name)
	if err != nil || moved.Location != "m1" || !moved.Running() || moved.Config["volatile.uuid"] != before.Config["volatile.uuid"] {
		t.Fatalf("after the move of a running instance: %+v %v", moved, err)
	}
}

// TestMigrateInterruptedThenTargetBack: an agent killed while it built the pair, then
// the target changed back: the pair (the record says the agent built it; never live) is
// deleted by the next apply, and the instance that served is untouched.
func TestMigrateInterruptedThenTargetBack(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)
	ctx := context.Background()
	h.apply(`  target = "m2"`)
	t.Cleanup(func() { restest.RemoveInstance(t, c.Client, h.name+"-b") })
	before, _, err := c.Client.GetInstance(ctx, h.name)
	if err != nil {
		t.Fatal(err)
	}
	// What a kill after the pair's create leaves: the intent recorded, the pair on m3.
	var rec Record
	if _, err := h.store.Load("container.c", &rec); err != nil {
		t.Fatal(err)
	}
	rec.Building = h.name + "-b"
	if err := h.store.Save("container.c", rec); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CreateInstance(ctx, incus.InstancesPost{Name: h.name + "-b", Source: incus.InstanceSource{Alias: "busybox"}, Target: "m3"}); err != nil {
		t.Fatal(err)
	}
	rep := h.engine(`  target = "m2"`).Apply(ctx, nil)
	st := rep.Steps[0]
	if st.Err != nil || !strings.Contains(st.Finished, h.name+"-b") {
		t.Fatalf("apply: %v, finished %q", st.Err, st.Finished)
	}
	if _, _, err := c.Client.GetInstance(ctx, h.name+"-b"); !incus.IsNotFound(err) {
		t.Errorf("the interrupted pair still exists: %v", err)
	}
	after, _, err := c.Client.GetInstance(ctx, h.name)
	if err != nil || after.Config["volatile.uuid"] != before.Config["volatile.uuid"] || !after.Running() {
		t.Errorf("the serving instance was touched: %+v %v", after, err)
	}
	rec = Record{}
	if _, err := h.store.Load("container.c", &rec); err != nil || rec.Building != "" {
		t.Errorf("record %+v %v", rec, err)
	}
}

// TestAbsentDeletesAMigrationsOtherHalf: the live instance of a container is gone (deleted
// by hand) while its record still holds the other half of an interrupted migration (a
// pair built on m3). ensure = "absent" deletes that half too, verified, before it drops
// the record: what leaves the plan leaves the host, also half of a migration.
func TestAbsentDeletesAMigrationsOtherHalf(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)
	ctx := context.Background()
	h.apply(`  target = "m2"`)
	pair := h.name + "-b"
	t.Cleanup(func() { restest.RemoveInstance(t, c.Client, pair) })
	var rec Record
	if _, err := h.store.Load("container.c", &rec); err != nil {
		t.Fatal(err)
	}
	rec.Building = pair
	if err := h.store.Save("container.c", rec); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.CreateInstance(ctx, incus.InstancesPost{Name: pair, Source: incus.InstanceSource{Alias: "busybox"}, Target: "m3"}); err != nil {
		t.Fatal(err)
	}
	restest.RemoveInstance(t, c.Client, h.name)

	absent := "  target = \"m2\"\n  ensure = \"absent\""
	st := h.plan(absent)
	if st.Err != nil || st.Diff.Action != agent.Delete || !strings.Contains(fmt.Sprint(st.Diff.Changes), pair) {
		t.Fatalf("plan: %v %+v, want a delete of %s", st.Err, st.Diff, pair)
	}
	if st := h.engine(absent).Apply(ctx, nil).Steps[0]; st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v (applied %v)", st.Err, st.Applied)
	}
	if _, _, err := c.Client.GetInstance(ctx, pair); !incus.IsNotFound(err) {
		t.Errorf("the migration's other half %s is still there: %v", pair, err)
	}
	if has, _ := h.store.Load("container.c", &Record{}); has {
		t.Error("the record is kept after the delete")
	}
	if st := h.plan(absent); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Errorf("plan after the delete: %v %+v", st.Err, st.Diff)
	}
}
