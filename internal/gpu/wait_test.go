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
			deadline := time.Now().Add(200 * time.Millisecond)
			err := WaitReleased(context.Background(), obs, tc.pids, deadline, 5*time.Millisecond)
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
				if late < 0 || late > 150*time.Millisecond {
					t.Errorf("returned %v after the deadline, want at it", late)
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

func TestWaitReleasedContextEndsTheWait(t *testing.T) {
	t.Parallel()
	obs := &script{answers: []Info{holding(Process{PID: 4242, UsedMemory: 1 << 30})}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := WaitReleased(ctx, obs, []int{4242}, time.Now().Add(time.Hour), 5*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "pid 4242 holds 1.0 GiB") {
		t.Errorf("WaitReleased = %v, want context.DeadlineExceeded naming pid 4242", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Error("the context did not end the wait")
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
