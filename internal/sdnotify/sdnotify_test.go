package sdnotify

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSend(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	n := New(sock)
	if err := n.Ready("1 resource, converged"); err != nil {
		t.Fatal(err)
	}
	if err := n.Reloading(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	k, _ := conn.Read(buf)
	if got := string(buf[:k]); got != "READY=1\nSTATUS=1 resource, converged\n" {
		t.Errorf("got %q", got)
	}
	k, _ = conn.Read(buf)
	if got := string(buf[:k]); !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") {
		t.Errorf("got %q", got)
	}
}

func TestDisabled(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := FromEnv().Ready("x"); err != nil {
		t.Errorf("a notifier without socket failed: %v", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "30000000")
	t.Setenv("WATCHDOG_PID", "")
	if got := WatchdogInterval(); got != 15*time.Second {
		t.Errorf("interval = %v, want 15s", got)
	}
	t.Setenv("WATCHDOG_PID", "1")
	if got := WatchdogInterval(); got != 0 {
		t.Errorf("interval for another PID = %v, want 0", got)
	}
}
