package server

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

// Issue 36, point 3: what the kinds remember between steps (here, that the loop already
// said it holds a rejected change) belongs to whoever runs the loop, handed to the kinds
// as Env.Memory, and not to the process: two engines in one process, each with its own
// memory, each say it once; an engine handed a memory that already holds it (the
// daemon's, across its plan reloads) does not say it again.
func TestTwoEnginesShareNoMemory(t *testing.T) {
	t.Parallel()
	h := newRevertHarness(t)
	mustOK(t, h.loop())
	if l := h.loop("faults=oom"); l.Err == nil || !strings.Contains(l.Err.Error(), "rolled back") {
		t.Fatalf("loop on the OOM change: %v", l.Err)
	}
	said := func(mem *agent.Memory) int {
		t.Helper()
		var buf bytes.Buffer
		e := h.engine(agent.Options{Loop: true, Memory: mem, Log: slog.New(slog.NewTextHandler(&buf, nil))}, "faults=oom")
		for range 2 {
			if st := e.Reconcile(context.Background(), "server.qwen"); st.Err != nil {
				t.Fatalf("a later pass: %v", st.Err)
			}
		}
		return strings.Count(buf.String(), "not launching the plan's change")
	}
	first, second := agent.NewMemory(), agent.NewMemory()
	if n := said(first); n != 1 {
		t.Errorf("the first engine said it holds the change %d times in two passes, want once", n)
	}
	if n := said(second); n != 1 {
		t.Errorf("a second engine with its own memory said it %d times, want once: it shares the first's", n)
	}
	if n := said(first); n != 0 {
		t.Errorf("an engine handed the first's memory said it %d times, want none: it was said", n)
	}
}
