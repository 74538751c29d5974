package server

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources/restest"
)

// liveGPU is a GPU observer on which the given PIDs hold memory while they are alive.
type liveGPU struct{ pids []int }

func (g liveGPU) Observe(ctx context.Context) (gpu.Info, error) {
	info := gpu.Info{State: gpu.StateOK, Source: gpu.SourceNVML, GPUs: []gpu.Device{{Index: 0, Name: "test GPU"}}}
	for _, pid := range g.pids {
		if st, err := (proc.FS{}).Stat(pid); err == nil && !st.Dead() {
			info.GPUs[0].Processes = append(info.GPUs[0].Processes, gpu.Process{PID: pid, UsedMemory: 1 << 30})
		}
	}
	return info, nil
}

// startGroup starts `sleep` in its own process group, as a launched server would be.
func startGroup(t *testing.T) (*exec.Cmd, proc.Stat) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	go cmd.Wait() // reap, so a killed process does not linger as our zombie
	st, err := (proc.FS{}).Stat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, st
}

func TestServerStopperStopsOnlyRecordedServers(t *testing.T) {
	t.Parallel()
	store := restest.OpenStore(t, t.TempDir())
	_, ours := startGroup(t)
	_, foreign := startGroup(t)
	// Its recorded stop block: SIGINT (which sleep obeys) within 5 s.
	rec := serverRecord{Generation: 3, PID: ours.PID, StartTicks: ours.StartTicks, PGID: ours.PGRP, SID: ours.Session, Place: "host",
		StopSignal: int(syscall.SIGINT), StopTimeout: 5 * time.Second}
	if err := store.Save("server.qwen", rec); err != nil {
		t.Fatal(err)
	}

	s := serverStopper{gpu: liveGPU{pids: []int{ours.PID, foreign.PID}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.StopGPUServers(ctx, store.For("nvidia_driver.host").Others(), []int{ours.PID, foreign.PID}, "nvidia_driver.host: 570 → 580"); err != nil {
		t.Fatal(err)
	}
	if alive, _ := (proc.FS{}).Alive(proc.Identity{PID: ours.PID, StartTicks: ours.StartTicks}); alive {
		t.Error("the agent's server still runs after StopGPUServers")
	}
	if alive, _ := (proc.FS{}).Alive(proc.Identity{PID: foreign.PID, StartTicks: foreign.StartTicks}); !alive {
		t.Error("a process no record names was signalled")
	}
}

func TestServerStopperIgnoresStaleRecords(t *testing.T) {
	t.Parallel()
	store := restest.OpenStore(t, t.TempDir())
	_, live := startGroup(t)
	// A record whose PID was reused: same PID, another start time. Never signalled.
	rec := serverRecord{PID: live.PID, StartTicks: live.StartTicks + 1, PGID: live.PGRP, SID: live.Session}
	if err := store.Save("server.old", rec); err != nil {
		t.Fatal(err)
	}
	s := serverStopper{gpu: liveGPU{pids: []int{live.PID}}}
	if err := s.StopGPUServers(context.Background(), store.For("nvidia_driver.host").Others(), []int{live.PID}, "test"); err != nil {
		t.Fatal(err)
	}
	if alive, _ := (proc.FS{}).Alive(proc.Identity{PID: live.PID, StartTicks: live.StartTicks}); !alive {
		t.Errorf("a reused PID was signalled")
	}
}
