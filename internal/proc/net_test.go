package proc

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPortOwnersAndPortFree(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "listen", setpgid)
	l := h.waitReady(t, 1)["listen"]
	port, err := strconv.Atoi(l.extra[0])
	if err != nil {
		t.Fatal(err)
	}
	fs := FS{}

	owners, err := fs.PortOwners(port)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(owners, l.pid) {
		t.Fatalf("PortOwners(%d) = %v, want it to hold %d", port, owners, l.pid)
	}

	err = fs.PortFree(testContext(t), port, 100*time.Millisecond)
	if !errors.Is(err, ErrPortHeld) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(l.pid)) {
		t.Fatalf("PortFree while held = %v, want ErrPortHeld naming pid %d", err, l.pid)
	}

	free := make(chan error, 1)
	go func() { free <- fs.PortFree(testContext(t), port, 30*time.Second) }()
	id := identify(t, l.pid)
	if _, err := fs.Stop(testContext(t), Target{Leader: id, PGID: l.pid}, syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-free:
		if err != nil {
			t.Fatalf("PortFree after Stop: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("PortFree did not return")
	}
	if owners, err := fs.PortOwners(port); err != nil || len(owners) != 0 {
		t.Errorf("PortOwners after Stop = %v, %v; want none", owners, err)
	}
}

func TestPortFreeCancelled(t *testing.T) {
	t.Parallel()
	h := startHelper(t, "listen", setpgid)
	port, _ := strconv.Atoi(h.waitReady(t, 1)["listen"].extra[0])
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := (FS{}).PortFree(ctx, port, time.Minute); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrPortHeld) {
		t.Errorf("PortFree = %v, want ErrPortHeld and context.DeadlineExceeded", err)
	}
	if err := (FS{}).PortFree(ctx, 0, time.Second); err == nil {
		t.Errorf("PortFree(0): no error")
	}
}
