package daemon

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNotifyReachesTheSocket sends each notification the loop uses to $NOTIFY_SOCKET
// through the default sender (go-systemd's SdNotify) and reads the datagrams systemd would.
// Not parallel: it sets the environment.
func TestNotifyReachesTheSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	n := newNotifier(nil)
	read := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := conn.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:k])
	}
	for _, c := range []struct {
		send func() error
		want string
	}{
		{func() error { return n.ready("1 resource, converged") }, "READY=1\nSTATUS=1 resource, converged\n"},
		{func() error { return n.status("waiting: lock") }, "STATUS=waiting: lock\n"},
		{n.stopping, "STOPPING=1\n"},
		{n.watchdog, "WATCHDOG=1\n"},
	} {
		if err := c.send(); err != nil {
			t.Fatal(err)
		}
		if got := read(); got != c.want {
			t.Errorf("sent %q, want %q", got, c.want)
		}
	}
	if err := n.reloading(); err != nil {
		t.Fatal(err)
	}
	if got := read(); !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") || !strings.HasSuffix(got, "\n") {
		t.Errorf("reloading sent %q", got)
	}
}

func TestNotifyOutsideSystemdSendsNothing(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if err := newNotifier(nil).ready("x"); err != nil {
		t.Errorf("a notifier without socket failed: %v", err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "30000000")
	t.Setenv("WATCHDOG_PID", "")
	if got, err := watchdogInterval(); got != 15*time.Second || err != nil {
		t.Errorf("interval = %v, %v; want 15s", got, err)
	}
	t.Setenv("WATCHDOG_PID", "1")
	if got, _ := watchdogInterval(); got != 0 {
		t.Errorf("interval for another PID = %v, want 0", got)
	}
	t.Setenv("WATCHDOG_USEC", "")
	if got, _ := watchdogInterval(); got != 0 {
		t.Errorf("interval without watchdog = %v, want 0", got)
	}
}
