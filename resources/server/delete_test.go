package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// A server whose block left the plan is an orphan. With the reconcile loop's option
// (OrphansByPlan) and no agent { prune = true }, it is reported and never deleted: the
// process runs on, its record stays. With prune = true a plan that keeps no server
// still refuses to delete them all, unless AllowDeleteAll; then the delete is the
// verified stop, and the record goes.
func TestServerOrphanPruneOffNeverDeletes(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	noServer := func(prune bool) string {
		return fmt.Sprintf("agent {\n  prune = %v\n}\nfile \"f\" {\n  path    = %q\n  content = \"x\\n\"\n}\n", prune, filepath.Join(h.dir, "f.txt"))
	}
	ctx := context.Background()
	for range 2 { // the loop's passes: never a delete
		rep := restest.Engine(t, h.dir, noServer(false), kindsFor(resources.Machine{}), h.store, agent.Options{Orphans: agent.OrphansByPlan}).Apply(ctx, nil)
		st := restest.StepOf(t, rep, "server.qwen")
		if st.Err != nil || st.Applied || !st.Orphan || st.Diff.Action != agent.Delete || !slices.ContainsFunc(st.Diff.Warnings, func(w string) bool { return strings.Contains(w, "prune = true") }) {
			t.Fatalf("orphan with prune off: %v applied=%v %+v", st.Err, st.Applied, st.Diff)
		}
		if r := h.record(); r.id() != first.id() || !alive(first.id()) {
			t.Fatalf("prune off touched the orphan: %+v alive=%v", r, alive(first.id()))
		}
	}
	stat := restest.Engine(t, h.dir, noServer(false), kindsFor(resources.Machine{}), h.store, agent.Options{}).Status(ctx)
	if st := restest.StepOf(t, stat, "server.qwen"); st.Status == nil || st.Status.Healthy || st.Status.Metrics["orphan"] != 1 {
		t.Errorf("orphan status: %+v", st.Status)
	}

	// prune = true, but the plan keeps no server: refused.
	rep := restest.Engine(t, h.dir, noServer(true), kindsFor(resources.Machine{}), h.store, agent.Options{}).Apply(ctx, nil)
	if st := restest.StepOf(t, rep, "server.qwen"); !errors.Is(st.Err, agent.ErrDeletesAll) || !alive(first.id()) {
		t.Fatalf("delete of every server: %v, alive %v", st.Err, alive(first.id()))
	}
	rep = restest.Engine(t, h.dir, noServer(true), kindsFor(resources.Machine{}), h.store, agent.Options{AllowDeleteAll: true}).Apply(ctx, nil)
	if st := restest.StepOf(t, rep, "server.qwen"); st.Err != nil || !st.Applied || st.Diff.Action != agent.Delete {
		t.Fatalf("pruned delete: %v %+v", st.Err, st.Diff)
	}
	if alive(first.id()) {
		t.Error("the deleted orphan still runs")
	}
	if ok, _ := h.store.Has("server.qwen"); ok {
		t.Error("the deleted orphan's record stays")
	}
	if _, err := os.Stat(filepath.Join(h.logs(), "qwen.1.log")); err != nil {
		t.Errorf("its log: %v", err)
	}
}

// A moved block keeps the record as it is: the same PID, start time and generation, no
// restart, and the old address is no orphan.
func TestServerMovedKeepsPIDAndGeneration(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	mustOK(t, h.apply())
	first := h.record()
	renamed := strings.Replace(srvPlan, `server "qwen" {`, `server "qwen2" {`, 1) + "\nmoved {\n  from = server.qwen\n  to   = server.qwen2\n}\n"
	vars := []string{"fake=" + fakeSGLang(t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}
	ctx := context.Background()
	plan := restest.Engine(t, h.dir, renamed, kindsFor(resources.Machine{}), h.store, agent.Options{Orphans: agent.OrphansDelete}, vars...).Plan(ctx)
	if len(plan.Steps) != 1 || plan.Steps[0].MovedFrom != "server.qwen" || plan.Steps[0].Err != nil || plan.Steps[0].Diff.Action != agent.NoOp {
		t.Fatalf("plan of a rename: %d steps, %+v", len(plan.Steps), plan.Steps[0])
	}
	rep := restest.Engine(t, h.dir, renamed, kindsFor(resources.Machine{}), h.store, agent.Options{Orphans: agent.OrphansDelete}, vars...).Apply(ctx, nil)
	if st := rep.Steps[0]; len(rep.Steps) != 1 || st.Err != nil || st.Applied {
		t.Fatalf("apply of a rename: %+v", st)
	}
	var moved serverRecord
	if ok, err := h.store.Load("server.qwen2", &moved); !ok || err != nil {
		t.Fatalf("no moved record: %v", err)
	}
	if ok, _ := h.store.Has("server.qwen"); ok {
		t.Error("the old record stays")
	}
	if moved.id() != first.id() || moved.Generation != 1 || moved.LogPath != first.LogPath || !alive(first.id()) {
		t.Errorf("moved record %+v, first %+v", moved, first)
	}
	// Put it back for the harness's cleanup.
	if err := h.store.Move("server.qwen2", "server.qwen"); err != nil {
		t.Fatal(err)
	}
}

// An orphan whose record cannot say what to delete (an older agent's download record
// without dest) is left alone with a warning, and never fails the plan.
func TestOldOrphanRecordLeftAlone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := restest.OpenStore(t, filepath.Join(dir, "state"))
	if err := store.Save("download.old", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf("file \"f\" {\n  path    = %q\n  content = \"x\"\n}\n", filepath.Join(dir, "f"))
	rep := restest.Engine(t, dir, src, kindsFor(resources.Machine{}), store, agent.Options{Orphans: agent.OrphansDelete}).Plan(context.Background())
	st := restest.StepOf(t, rep, "download.old")
	if st.Err != nil || st.Diff.Action != agent.NoOp || len(st.Diff.Warnings) != 1 || !strings.Contains(st.Diff.Warnings[0], "left alone") {
		t.Fatalf("old orphan: %v %+v", st.Err, st.Diff)
	}
}
