package proc

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultStopProgressEvery is how often the loop's log and `agent apply`/`destroy` report
// a stop that waits for a server to exit.
const DefaultStopProgressEvery = 5 * time.Second

// StopProgress is what a stop reports while it waits (WithStopProgress): a server that
// takes a minute to drain its requests after SIGTERM is a minute of silence otherwise.
type StopProgress struct {
	Leader Identity
	// Signal is the last signal sent: the stop signal, then SIGKILL.
	Signal syscall.Signal
	// Waited is how long the processes have had since Signal was sent, of Wait.
	Waited, Wait time.Duration
	// Left is how many of the processes signalled are not yet seen gone.
	Left int
}

// String is the report as people read it: "pid 4711, 10 s of 30 s, SIGTERM sent; 1
// process left".
func (p StopProgress) String() string {
	return fmt.Sprintf("pid %d, %.0f s of %.0f s, %s sent; %s left", p.Leader.PID, p.Waited.Seconds(), p.Wait.Seconds(), p.SignalName(), processes(p.Left))
}

// SignalName is the signal as a unit file writes it: SIGTERM.
func (p StopProgress) SignalName() string {
	if n := unix.SignalName(p.Signal); n != "" {
		return n
	}
	return p.Signal.String()
}

func processes(n int) string {
	if n == 1 {
		return "1 process"
	}
	return fmt.Sprintf("%d processes", n)
}

type stopProgressKey struct{}

type stopProgress struct {
	every time.Duration
	fn    func(StopProgress)
}

// WithStopProgress returns a context under which Stop calls fn every `every` while it
// waits for the processes it signalled to go. It is how a caller that logs (the
// reconcile loop) hears of a long stop without this package printing anything: the
// context reaches Stop through the resource and the lifecycle untouched.
func WithStopProgress(ctx context.Context, every time.Duration, fn func(StopProgress)) context.Context {
	if every <= 0 || fn == nil {
		return ctx
	}
	return context.WithValue(ctx, stopProgressKey{}, stopProgress{every: every, fn: fn})
}

// progressTicker is the context's progress hook for one wait after sig: tick is nil
// when there is none (a nil channel never fires), report sends one line.
func progressTicker(ctx context.Context, leader Identity, sig syscall.Signal, wait time.Duration) (tick <-chan time.Time, report func(left int), stop func()) {
	p, ok := ctx.Value(stopProgressKey{}).(stopProgress)
	if !ok {
		return nil, func(int) {}, func() {}
	}
	t := time.NewTicker(p.every)
	began := time.Now()
	return t.C, func(left int) {
		p.fn(StopProgress{Leader: leader, Signal: sig, Waited: time.Since(began), Wait: wait, Left: left})
	}, t.Stop
}
