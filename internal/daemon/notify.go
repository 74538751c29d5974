package daemon

import (
	"time"

	sd "github.com/coreos/go-systemd/v22/daemon"
)

// notifier tells systemd what the loop is doing (sd_notify(3)): READY=1 once the endpoint
// serves, RELOADING=1 around a plan reload, STATUS= with the summary line, WATCHDOG=1 while
// no step is stuck, STOPPING=1 on the way out. Outside systemd ($NOTIFY_SOCKET unset) it
// sends nothing, so the loop notifies unconditionally.
type notifier struct {
	// send sends one datagram; go-systemd's SdNotify by default, a recorder in tests.
	send func(state string) error
}

func newNotifier(send func(state string) error) notifier {
	if send == nil {
		send = func(state string) error {
			_, err := sd.SdNotify(false, state)
			return err
		}
	}
	return notifier{send: send}
}

// ready says the service is up, with a status line.
func (n notifier) ready(status string) error {
	return n.send(sd.SdNotifyReady + "\nSTATUS=" + status + "\n")
}

// status updates the one-line status shown by systemctl status.
func (n notifier) status(status string) error { return n.send("STATUS=" + status + "\n") }

// reloading says a reload started; ready ends it. systemd 253+ wants the monotonic time
// (Type=notify-reload).
func (n notifier) reloading() error {
	return n.send(sd.SdNotifyReloading + "\n" + sd.SdNotifyMonotonicUsec())
}

// stopping says the service is shutting down.
func (n notifier) stopping() error { return n.send(sd.SdNotifyStopping + "\n") }

// watchdog pings the watchdog.
func (n notifier) watchdog() error { return n.send(sd.SdNotifyWatchdog + "\n") }

// watchdogInterval returns how often to ping: half of $WATCHDOG_USEC, as sd_watchdog_enabled(3)
// advises, or 0 when the watchdog is off, meant for another process ($WATCHDOG_PID) or
// malformed (err says how).
func watchdogInterval() (time.Duration, error) {
	every, err := sd.SdWatchdogEnabled(false)
	return every / 2, err
}
