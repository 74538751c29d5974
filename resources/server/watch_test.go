package server

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/proc"
)

// The watch returns within a second of the watched process's death, and never for
// another process that reuses nothing of its identity.
func TestWatchProcessNoticesAnExitAtOnce(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var fs proc.FS
	id, err := fs.Identify(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}

	// A live process: the watch waits until its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := watchProcess(ctx, fs, id); err == nil {
		t.Fatal("the watch returned while the process lives")
	}

	// Another start time (the PID reused): gone at once.
	if err := watchProcess(context.Background(), fs, proc.Identity{PID: id.PID, StartTicks: id.StartTicks + 1}); err != nil {
		t.Fatalf("a reused PID: %v", err)
	}

	done := make(chan error, 1)
	go func() { done <- watchProcess(context.Background(), fs, id) }()
	time.Sleep(100 * time.Millisecond)
	killed := time.Now()
	// Not reaped (a zombie while the test holds it): the exit still counts.
	if err := syscall.Kill(id.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch = %v", err)
		}
		if d := time.Since(killed); d > time.Second {
			t.Errorf("the exit was noticed after %s, want within 1 s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not notice the exit")
	}
}
