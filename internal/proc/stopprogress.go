package proc

import (
	"context"
	"syscall"
	"time"
)

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
