package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// incusCluster is this test binary's private three-member Incus cluster, formed by the
// first cluster test. A test that takes a member down (stops or freezes its incusd) is
// serial, and brings the member back before it ends: Go runs every serial test of the
// package before the first parallel one, so those never see a member missing. The others
// leave the cluster whole and are parallel, overlapping their waits with the rest of the
// package's parallel tests (the package's critical path; see scripts/test.sh).
var incusCluster = incustest.NewSharedCluster()

// clusterCtr runs plans of one container through the first member's socket.
type clusterCtr struct {
	t     *testing.T
	c     *incustest.Cluster
	dir   string
	store *state.Store
	name  string
}

func newClusterCtr(t *testing.T, c *incustest.Cluster) *clusterCtr {
	t.Helper()
	dir := t.TempDir()
	store, err := state.Open(filepath.Join(dir, ".state"))
	if err != nil {
		t.Fatal(err)
	}
	return &clusterCtr{t: t, c: c, dir: dir, store: store, name: c.InstanceName(t)}
}

func (h *clusterCtr) engine(body string) *agent.Engine {
	h.t.Helper()
	src := fmt.Sprintf(`
variable "incus_socket" {}
agent { incus_socket = var.incus_socket }
container "c" {
  name  = %q
  image = "busybox"
  stop_timeout = "10s"
%s
}
`, h.name, body)
	return restest.Engine(h.t, h.dir, src, kindsFor(resources.Machine{GPU: restest.A6000}), h.store, agent.Options{StepTimeout: 2 * time.Minute}, "incus_socket="+h.c.Socket)
}

func (h *clusterCtr) plan(body string) *agent.Step {
	h.t.Helper()
	return h.engine(body).Plan(context.Background()).Steps[0]
}

func (h *clusterCtr) status(body string) *agent.Step {
	h.t.Helper()
	return h.engine(body).Status(context.Background()).Steps[0]
}

// apply applies and requires success and a no-op plan afterwards.
func (h *clusterCtr) apply(body string) *agent.Diff {
	h.t.Helper()
	e := h.engine(body)
	st := e.Apply(context.Background(), nil).Steps[0]
	if st.Err != nil {
		h.t.Fatalf("apply: %v\n%s", st.Err, h.c.LogTail(15))
	}
	again := e.Plan(context.Background()).Steps[0]
	if again.Err != nil || again.Diff.Action != agent.NoOp {
		h.t.Fatalf("second plan is not a no-op: %v %+v", again.Err, again.Diff)
	}
	return st.Diff
}

func (h *clusterCtr) location() string {
	h.t.Helper()
	inst, _, err := h.c.Client.GetInstance(context.Background(), h.name)
	if err != nil {
		h.t.Fatal(err)
	}
	return inst.Location
}

// TestContainerOnClusterMember: target places a new instance on that member (its files
// in that member's INCUS_DIR), plan and status name the member; an unknown member and a
// GPU the member lacks are refused with the fix, before anything is created or changed;
// a target other than the instance's member plans a migration.
func TestContainerOnClusterMember(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)

	d := h.plan(`  target = "m2"`)
	if d.Err != nil || !hasChange(d.Diff, "target", "") || d.Diff.Action != agent.Create {
		t.Fatalf("plan: %v %+v", d.Err, d.Diff)
	}
	for _, ch := range d.Diff.Changes {
		if ch.Attr == "target" && ch.New != `"m2"` && ch.New != "m2" {
			t.Errorf("target change: %+v", ch)
		}
	}
	h.apply(`  target = "m2"`)
	if loc := h.location(); loc != "m2" {
		t.Fatalf("instance on %q, want m2", loc)
	}
	if _, err := os.Stat(filepath.Join(c.Member("m2").Dir, "containers", h.name)); err != nil {
		t.Fatalf("not in m2's INCUS_DIR: %v", err)
	}
	st := h.status(`  target = "m2"`)
	if st.Err != nil || !st.Status.Healthy || restest.Field(st.Status, agent.MemberField) != "m2" || st.Status.Member() != "m2" {
		t.Fatalf("status: %v %+v", st.Err, st.Status)
	}

	// A GPU added to the instance on m2 is checked against m2, before the update.
	restest.WantErr(t, h.plan("  target = \"m2\"\n  gpu \"gpu0\" { pci = \"7f:1f.7\" }\n").Err,
		`gpu "gpu0" selects pci 0000:7f:1f.7, which member m2 does not have; GPUs on member m2: none found`)

	// The instance is on m2; a plan that says m1 is a migration, not silently ignored
	// (container_migrate_test.go carries them out): a move, as no server runs in it.
	if p := h.plan(`  target = "m1"`); p.Err != nil || p.Diff.Action != agent.Restart || p.Diff.Changes[0].Reason != agent.ReasonMigrate {
		t.Errorf("plan with target m1: %v %+v", p.Err, p.Diff)
	}

	other := newClusterCtr(t, c)
	restest.WantErr(t, other.plan(`  target = "m9"`).Err, `target "m9" is not a member of the cluster (members: m1, m2, m3)`)
	restest.WantErr(t, other.plan("  target = \"m3\"\n  gpu \"gpu0\" { pci = \"7f:1f.7\" }\n").Err,
		`gpu "gpu0" selects pci 0000:7f:1f.7, which member m3 does not have; GPUs on member m3: none found`)
	if _, _, err := c.Client.GetInstance(context.Background(), other.name); !incus.IsNotFound(err) {
		t.Errorf("a refused plan created %s: %v", other.name, err)
	}
}

// TestContainerOnOfflineMember: a member whose incusd stopped is an observed state with
// a clear message in plan and status, never a crash and never a "stopped, start it";
// once the member is back the plan converges again.
func TestContainerOnOfflineMember(t *testing.T) {
	c := incusCluster.Start(t)
	h := newClusterCtr(t, c)
	h.apply(`  target = "m3"`)

	m3 := c.Member("m3")
	if err := m3.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // the member back for the next test, also when this one fails
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if m3.Running() {
			return
		}
		if err := c.Restart(ctx, m3); err != nil {
			t.Errorf("restart m3: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.WaitMembers(ctx, incus.MemberOffline, "m3"); err != nil {
		t.Fatal(err)
	}
	restest.WantErr(t, h.plan(`  target = "m3"`).Err, "member m3 is Offline", "No heartbeat", "can be neither observed nor changed")
	st := h.status(`  target = "m3"`)
	if st.Err != nil || st.Status == nil || st.Status.Healthy || restest.Field(st.Status, agent.MemberField) != "m3" ||
		!strings.Contains(st.Status.Summary, "member m3 is Offline") {
		t.Fatalf("status with m3 offline: %v %+v", st.Err, st.Status)
	}
	t.Logf("status: %s", st.Status.Summary)

	if err := c.Restart(ctx, m3); err != nil {
		t.Fatal(err)
	}
	// Back: whatever the restart left (Incus restarts what ran), one apply converges.
	h.apply(`  target = "m3"`)
	if loc := h.location(); loc != "m3" {
		t.Errorf("instance on %q after m3 came back", loc)
	}
}
