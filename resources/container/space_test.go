package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/testbin"
)

// A create is refused at plan time when the storage pool of the instance's root disk
// has less room than the image needs (before, Incus failed halfway through the unpack,
// after the plan had said "create"): the error names the pool, its free and the needed
// bytes, and the fix. The pool is a real "dir" pool on a real tmpfs, filled; with the
// room back, the same plan creates.
func TestContainerCreateNeedsRoomInItsPool(t *testing.T) {
	h := newCtrHarness(t)
	fs := testbin.Tmpfs(t, "32m")
	pool := h.name + "-pool"
	src := filepath.Join(fs, "pool")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := h.d.Client.Query(ctx, "POST", "/1.0/storage-pools", map[string]any{
		"name": pool, "driver": "dir", "config": map[string]string{"source": src},
	}, nil); err != nil {
		t.Fatalf("create pool: %v\n%s", err, h.d.LogTail(10))
	}
	t.Cleanup(func() {
		if err := h.d.Client.Query(context.Background(), "DELETE", "/1.0/storage-pools/"+pool, nil, nil); err != nil {
			t.Errorf("delete pool %s: %v", pool, err)
		}
	})
	body := fmt.Sprintf(`  image = "busybox"
  device "root" {
    type    = "disk"
    options = { path = "/", pool = %q }
  }`, pool)

	filler := filepath.Join(fs, "filler")
	testbin.Fill(t, filler)
	st := h.engine(body).Plan(ctx).Steps[0]
	if st.Err == nil {
		t.Fatalf("plan with pool %s full = %+v, want an error", pool, st.Diff)
	}
	msg := st.Err.Error()
	for _, want := range []string{"storage pool " + pool + " has ", " free (", "needs at least", "incus storage info " + pool, "path = \"/\""} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	t.Logf("full: %s", msg)

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if d := h.plan(body); d.Action != agent.Create {
		t.Errorf("plan with room = %+v, want a create", d)
	}
}
