package container

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/file"
	"github.com/agent-dev/agent/resources/restest"
)

// A container with ensure = "absent" is stopped and deleted, verified, on the private
// incusd; an orphan container is deleted only while the instance is the one its record
// names.
func TestContainerEnsureAbsentAndOrphan(t *testing.T) {
	h := newCtrHarness(t)
	base := "  image = \"busybox\"\n  stop_timeout = \"5s\"\n"
	h.apply(base)
	if inst, _ := h.inst(); !inst.Running() {
		t.Fatal("not running")
	}
	d := h.plan(base + "  ensure = \"absent\"\n")
	if d.Action != agent.Delete || len(d.Changes) != 1 || d.Changes[0].Why() != agent.ReasonEnsureAbsent {
		t.Fatalf("absent plan: %s %+v", d.Action, d.Changes)
	}
	h.apply(base + "  ensure = \"absent\"\n")
	if _, _, err := h.d.Client.GetInstance(context.Background(), h.name); !incus.IsNotFound(err) {
		t.Fatalf("instance after delete: %v", err)
	}
	if ok, _ := h.store.Has("container.c"); ok {
		t.Error("record kept after the delete")
	}

	// Again, then the block leaves the plan: an orphan, deleted by its record.
	h.apply(base)
	src := fmt.Sprintf("variable \"incus_socket\" {}\nagent { incus_socket = var.incus_socket }\nfile \"f\" {\n  path = %q\n  content = \"x\"\n}\n", filepath.Join(h.dir, "f"))
	e := restest.Engine(t, h.dir, src, append(kindsFor(resources.Machine{GPU: restest.A6000}), file.FileKind()), h.store, agent.Options{Orphans: agent.OrphansDelete, StepTimeout: time.Minute}, "incus_socket="+h.d.Socket)
	rep := e.Apply(context.Background(), nil)
	if st := restest.StepOf(t, rep, "container.c"); st.Err != nil || !st.Applied || st.Diff.Action != agent.Delete || st.Diff.Changes[0].Why() != agent.ReasonOrphan {
		t.Fatalf("orphan delete: %v %+v", st.Err, st.Diff)
	}
	if _, _, err := h.d.Client.GetInstance(context.Background(), h.name); !incus.IsNotFound(err) {
		t.Fatalf("orphan instance after delete: %v", err)
	}
}
