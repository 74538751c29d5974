package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/bytesize"
)

// ErrNotReleased is wrapped by WaitReleased's error when processes still
// hold GPU memory at the deadline.
var ErrNotReleased = errors.New("GPU memory not released")

// DefaultPollInterval is WaitReleased's interval when it is given none.
const DefaultPollInterval = 500 * time.Millisecond

// ProcessesUsing returns the processes among pids that hold memory on any
// GPU in info, one entry per PID with its memory summed over all GPUs,
// sorted by PID. It returns nil when none does.
func ProcessesUsing(info Info, pids []int) []Process {
	if len(pids) == 0 {
		return nil
	}
	var held []Process
	for _, d := range info.GPUs {
		for _, p := range d.Processes {
			if !slices.Contains(pids, p.PID) {
				continue
			}
			if i := slices.IndexFunc(held, func(h Process) bool { return h.PID == p.PID }); i >= 0 {
				held[i].UsedMemory += p.UsedMemory
				continue
			}
			held = append(held, p)
		}
	}
	slices.SortFunc(held, func(a, b Process) int { return a.PID - b.PID })
	return held
}

// WaitReleased polls obs every poll (DefaultPollInterval when poll <= 0)
// until none of pids holds GPU memory, and returns nil then. It returns an
// error wrapping ErrNotReleased, naming each PID still present and the
// memory it holds, when the deadline passes first; it observes one last time
// at the deadline, never later.
//
// It returns nil at once when there is nothing it could wait on: no pids,
// a state other than StateOK (no library, no driver, no GPU: no process can
// hold GPU memory that NVML could show), or an Info from ProcFS, which cannot
// see processes. An error from Observe or the context ends the wait with
// that error.
func WaitReleased(ctx context.Context, obs Observer, pids []int, deadline time.Time, poll time.Duration) error {
	if len(pids) == 0 {
		return nil
	}
	if poll <= 0 {
		poll = DefaultPollInterval
	}
	for {
		info, err := obs.Observe(ctx)
		if err != nil {
			return fmt.Errorf("gpu: waiting for GPU memory of %s to be released: %w", formatPIDs(pids), err)
		}
		if info.State != StateOK || info.Source != SourceNVML {
			return nil
		}
		held := ProcessesUsing(info, pids)
		if len(held) == 0 {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("gpu: %w by the deadline: %s", ErrNotReleased, formatHeld(held))
		}
		t := time.NewTimer(min(poll, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gpu: waiting for GPU memory to be released (%s): %w", formatHeld(held), ctx.Err())
		case <-t.C:
		}
	}
}

func formatHeld(held []Process) string {
	parts := make([]string, len(held))
	for i, p := range held {
		parts[i] = fmt.Sprintf("pid %d holds %s", p.PID, bytesize.Format(p.UsedMemory))
	}
	return strings.Join(parts, ", ")
}

func formatPIDs(pids []int) string {
	parts := make([]string, len(pids))
	for i, p := range pids {
		parts[i] = fmt.Sprint(p)
	}
	return "pid " + strings.Join(parts, ", ")
}
