// Package sdnotify speaks systemd's notify protocol (sd_notify(3)): datagrams such as
// READY=1, STATUS=…, WATCHDOG=1 sent to the unix socket named by $NOTIFY_SOCKET. It is a
// few lines, so the agent carries it instead of a dependency.
package sdnotify

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Notifier sends notifications; the zero value (no socket) sends nothing, so code can
// notify unconditionally and run the same outside systemd.
type Notifier struct {
	socket string
}

// FromEnv returns a Notifier for $NOTIFY_SOCKET (none when unset).
func FromEnv() *Notifier { return &Notifier{socket: os.Getenv("NOTIFY_SOCKET")} }

// New returns a Notifier for the given socket path ("@name" is an abstract socket).
func New(socket string) *Notifier { return &Notifier{socket: socket} }

// Enabled reports whether notifications go anywhere.
func (n *Notifier) Enabled() bool { return n != nil && n.socket != "" }

// Send sends one datagram made of the given KEY=VALUE lines.
func (n *Notifier) Send(lines ...string) error {
	if !n.Enabled() {
		return nil
	}
	addr := &net.UnixAddr{Name: n.socket, Net: "unixgram"}
	if strings.HasPrefix(n.socket, "@") {
		addr.Name = "\x00" + n.socket[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	defer conn.Close()
	_, err = conn.Write([]byte(strings.Join(lines, "\n") + "\n"))
	if err != nil {
		return fmt.Errorf("sd_notify: %w", err)
	}
	return nil
}

// Ready says the service is up (READY=1) with a status line.
func (n *Notifier) Ready(status string) error { return n.Send("READY=1", "STATUS="+status) }

// Status updates the one-line status shown by systemctl status.
func (n *Notifier) Status(status string) error { return n.Send("STATUS=" + status) }

// Reloading says a reload started; Ready ends it. systemd 253+ wants the monotonic time.
func (n *Notifier) Reloading() error {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	usec := ts.Sec*1e6 + ts.Nsec/1e3
	return n.Send("RELOADING=1", "MONOTONIC_USEC="+strconv.FormatInt(usec, 10))
}

// Stopping says the service is shutting down.
func (n *Notifier) Stopping() error { return n.Send("STOPPING=1") }

// Watchdog pings the watchdog.
func (n *Notifier) Watchdog() error { return n.Send("WATCHDOG=1") }

// WatchdogInterval returns how often to ping: half of $WATCHDOG_USEC, or 0 when the
// watchdog is off or meant for another process ($WATCHDOG_PID).
func WatchdogInterval() time.Duration {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return 0
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0
	}
	return time.Duration(usec) * time.Microsecond / 2
}
