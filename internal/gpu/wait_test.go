package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func holding(procs ...Process) Info {
	return Info{State: StateOK, Source: SourceNVML, GPUs: []Device{
		{Index: 0, PCIBusID: "0000:18:00.0", Processes: procs},
		{Index: 1, PCIBusID: "0000:2a:00.0", Processes: []Process{{PID: 9999, UsedMemory: 1 << 30}}}, // not ours
	}}
}

func TestWaitReleased(t *testing.T) {
	t.Parallel()
	held := holding(Process{PID: 4242, UsedMemory: 70 << 30}, Process{PID: 4243, UsedMemory: 3 << 29})
	free := holding()
	for _, tc := range []struct {
		name      string
		answers   []Info
		pids      []int
		wantErr   []string // substrings of the error; nil: success
		wantCalls int      // 0: at least one
	}{
		{name: "released already", answers: []Info{free}, pids: []int{4242}, wantCalls: 1},
		{name: "released late", answers: []Info{held, held, held, free}, pids: []int{4242, 4243}, wantCalls: 4},
		{name: "others' processes do not count", answers: []Info{held}, pids: []int{9999 + 1}, wantCalls: 1},
		{name: "no pids: nothing observed", answers: []Info{held}, pids: nil},
		{name: "no library: no-op", answers: []Info{{State: StateNoLibrary, Source: SourceNVML}}, pids: []int{4242}, wantCalls: 1},
		{name: "no GPU: no-op", answers: []Info{{State: StateNoGPU, Source: SourceNVML}}, pids: []int{4242}, wantCalls: 1},
		{name: "procfs cannot see processes: no-op", answers: []Info{{State: StateOK, Source: SourceProcFS}}, pids: []int{4242}, wantCalls: 1},
		{
			name:    "never released",
			answers: []Info{held},
			pids:    []int{4243, 4242, 1},
			wantErr: []string{"GPU memory not released by the deadline", "pid 4242 holds 70.0 GiB", "pid 4243 holds 1.5 GiB"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			obs := &script{answers: tc.answers}
			// Successes poll often against a distant deadline, so a slow machine
			// cannot make them late. Failures poll once an hour against a near
			// deadline: the last look must come at the deadline, not a poll later.
			deadline, poll := time.Now().Add(time.Minute), 5*time.Millisecond
			if tc.wantErr != nil {
				deadline, poll = time.Now().Add(200*time.Millisecond), time.Hour
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // bounds a wrong wait
			defer cancel()
			err := WaitReleased(ctx, obs, tc.pids, deadline, poll)
			late := time.Since(deadline)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("WaitReleased: %v", err)
			case tc.wantErr != nil:
				if !errors.Is(err, ErrNotReleased) {
					t.Fatalf("WaitReleased: err = %v, want ErrNotReleased", err)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				if strings.Contains(err.Error(), "pid 1 ") || strings.Contains(err.Error(), "9999") {
					t.Errorf("error %q names a process that holds nothing of ours", err)
				}
				if late < 0 || late > 20*time.Second {
					t.Errorf("returned %v after the deadline, want at it (not a poll interval later)", late)
				}
				if obs.Calls() != 2 {
					t.Errorf("Observe called %d times, want 2: at the start and at the deadline", obs.Calls())
				}
			}
			if tc.wantCalls != 0 && obs.Calls() != tc.wantCalls {
				t.Errorf("Observe called %d times, want %d", obs.Calls(), tc.wantCalls)
			}
			if tc.pids == nil && obs.Calls() != 0 {
				t.Errorf("Observe called %d times with no pids, want 0", obs.Calls())
			}
		})
	}
}

// cancelAfterFirst answers from script and cancels the context once it has answered
// once: the context ends while WaitReleased waits to poll again, however slow the
// machine.
type cancelAfterFirst struct {
	*script
	cancel context.CancelFunc
}

func (c cancelAfterFirst) Observe(ctx context.Context) (Info, error) {
	info, err := c.script.Observe(ctx)
	c.cancel()
	return info, err
}

func TestWaitReleasedContextEndsTheWait(t *testing.T) {
	t.Parallel()
	held := holding(Process{PID: 4242, UsedMemory: 1 << 30})

	// Ended while waiting between polls: the error names what was held.
	ctx, cancel := context.WithCancel(context.Background())
	obs := cancelAfterFirst{&script{answers: []Info{held}}, cancel}
	err := WaitReleased(ctx, obs, []int{4242}, time.Now().Add(time.Hour), time.Hour)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "pid 4242 holds 1.0 GiB") {
		t.Errorf("WaitReleased = %v, want context.Canceled naming pid 4242 and its memory", err)
	}
	if obs.Calls() != 1 {
		t.Errorf("Observe called %d times, want 1", obs.Calls())
	}

	// Ended before the first observation: the error names the pids waited on.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	err = WaitReleased(ctx, &script{answers: []Info{held}}, []int{4242}, time.Now().Add(time.Hour), time.Hour)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "pid 4242") {
		t.Errorf("WaitReleased = %v, want context.Canceled naming pid 4242", err)
	}
}

func TestWaitReleasedObserveError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	obs := observerFunc(func(context.Context) (Info, error) { return Info{}, boom })
	err := WaitReleased(context.Background(), obs, []int{4242}, time.Now().Add(time.Second), 0)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "pid 4242") {
		t.Errorf("WaitReleased = %v, want it to wrap the Observe error and name pid 4242", err)
	}
}

type observerFunc func(context.Context) (Info, error)

func (f observerFunc) Observe(ctx context.Context) (Info, error) { return f(ctx) }
