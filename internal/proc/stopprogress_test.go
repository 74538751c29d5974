package proc

import (
	"sync"
	"syscall"
	"testing"
	"time"
)

// A process that ignores SIGTERM is waited for through the whole stop timeout; the
// context's progress hook hears of the wait every tick (the signal, how long of how
// long, how many left), then of nothing once the stop is over.
func TestStopReportsProgress(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "ignore-term", setpgid)
	pid := h.waitReady(t, 1)["ignore-term"].pid
	id := identify(t, pid)

	var mu sync.Mutex
	var seen []StopProgress
	ctx := WithStopProgress(testContext(t), 100*time.Millisecond, func(p StopProgress) {
		mu.Lock()
		seen = append(seen, p)
		mu.Unlock()
	})
	rep, err := FS{}.Stop(ctx, Target{Leader: id, PGID: pid}, syscall.SIGTERM, 700*time.Millisecond)
	if err != nil || len(rep.Killed) != 1 {
		t.Fatalf("Stop = %+v, %v; want the helper killed", rep, err)
	}
	mu.Lock()
	got := append([]StopProgress(nil), seen...)
	mu.Unlock()
	// A loaded machine may skip ticks; at least two of the seven fit in the wait.
	if len(got) < 2 {
		t.Fatalf("%d progress reports during a 700 ms wait, want at least 2: %+v", len(got), got)
	}
	for i, p := range got {
		if p.Leader != id || p.Signal != syscall.SIGTERM || p.Wait != 700*time.Millisecond || p.Left != 1 {
			t.Errorf("report %d = %+v, want the helper, SIGTERM, 700ms, 1 left", i, p)
		}
		if i > 0 && p.Waited <= got[i-1].Waited {
			t.Errorf("report %d waited %s, not after report %d's %s", i, p.Waited, i-1, got[i-1].Waited)
		}
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	after := len(seen)
	mu.Unlock()
	if after != len(got) {
		t.Errorf("%d progress reports after Stop returned", after-len(got))
	}
}

func TestStopProgressString(t *testing.T) {
	for _, c := range []struct {
		p    StopProgress
		want string
	}{
		{StopProgress{Leader: Identity{PID: 4711}, Signal: syscall.SIGTERM, Waited: 10400 * time.Millisecond, Wait: 30 * time.Second, Left: 1},
			"pid 4711, 10 s of 30 s, SIGTERM sent; 1 process left"},
		{StopProgress{Leader: Identity{PID: 12}, Signal: syscall.SIGKILL, Waited: 2 * time.Second, Wait: 5 * time.Second, Left: 3},
			"pid 12, 2 s of 5 s, SIGKILL sent; 3 processes left"},
	} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.p, got, c.want)
		}
	}
}
