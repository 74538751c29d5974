package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
)

// serverStopper is the GPUServerStopper wired in by KindsFor: before a driver change it
// stops, with the server lifecycle's verified kill, every server this agent launched (or
// adopted) that holds GPU memory. It finds them through their state records, never by
// name: a GPU process belongs to a server when it is the recorded leader (PID and start
// time), or is in the recorded process group or session. Processes that belong to no
// record are left alone; the driver then names them and refuses.
type serverStopper struct {
	proc proc.FS
	gpu  gpu.Observer
}

var _ resources.GPUServerStopper = serverStopper{}

// ServerStopper is the server kind's stop of the servers that hold the GPUs, reading
// processes through p and the GPUs through g.
func ServerStopper(p proc.FS, g gpu.Observer) resources.GPUServerStopper {
	return serverStopper{proc: p, gpu: g}
}

func (s serverStopper) StopGPUServers(ctx context.Context, records *state.View, gpuPIDs []int, reason string) error {
	servers, err := serverRecords(records)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	for _, sr := range servers {
		addr, rec := sr.addr, sr.rec
		if rec.PID <= 0 {
			continue
		}
		alive, err := s.proc.Alive(rec.id())
		if err != nil || !alive || (gpuPIDs != nil && !s.holdsGPU(&rec, gpuPIDs)) {
			continue
		}
		// Machine PIDs, whatever the place: the host's /proc sees container processes too.
		// The port check only means something in the agent's own network namespace.
		port := rec.Port
		if rec.Place != "" && rec.Place != "host" {
			port = 0
		}
		lc := &lifecycle.Lifecycle{Place: lifecycle.Local{Proc: s.proc}, GPU: s.gpu}
		// The server's own stop block, as recorded at launch (the kind's defaults for a
		// record written before the agent recorded it).
		sig, timeout := syscall.Signal(rec.StopSignal), rec.StopTimeout
		if sig == 0 {
			sig = syscall.SIGTERM
		}
		if timeout <= 0 {
			timeout = DefaultStopTimeout
		}
		if _, err := lc.Stop(ctx, rec.target(), sig, timeout, port); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop %s (pid %d): %w", reason, addr, rec.PID, err))
		}
		// The record stays: the server resource sees its process gone and relaunches it on
		// the next apply, on the new driver.
	}
	return errors.Join(errs...)
}

// holdsGPU reports whether one of the GPU processes belongs to the recorded server.
func (s serverStopper) holdsGPU(rec *serverRecord, gpuPIDs []int) bool {
	if slices.Contains(gpuPIDs, rec.PID) {
		return true
	}
	for _, pid := range gpuPIDs {
		st, err := s.proc.Stat(pid)
		if err != nil {
			continue
		}
		if (rec.PGID > 0 && st.PGRP == rec.PGID) || (rec.SID > 0 && st.Session == rec.SID) {
			return true
		}
	}
	return false
}

// namedServer is a server's record with its address.
type namedServer struct {
	addr string
	rec  serverRecord
}

// serverRecords is every server record of records (nil: none), for the stop of the
// servers that hold the GPUs before a driver change (gpu_stopper.go). A record that
// cannot be read is an error beside the others, never a reason to skip the rest.
func serverRecords(records *state.View) ([]namedServer, error) {
	if records == nil {
		return nil, nil
	}
	addrs, err := records.List("server")
	if err != nil {
		return nil, err
	}
	var out []namedServer
	var errs []error
	for _, addr := range addrs {
		var rec serverRecord
		if ok, err := records.Load(addr, &rec); err != nil {
			errs = append(errs, err)
			continue
		} else if ok {
			out = append(out, namedServer{addr, rec})
		}
	}
	return out, errors.Join(errs...)
}
