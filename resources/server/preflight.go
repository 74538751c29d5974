package server

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/warm"
)

// launches reports whether applying d starts a new server process.
func launches(d *agent.Diff) bool {
	return d.Action == agent.Create || d.Action == agent.Restart || d.Action == agent.Replace
}

// preflight checks, before a launch, that the model's weights fit on the GPUs the server
// is given (gpu.Preflight: weights / tp against free memory × mem-fraction-static on each
// selected GPU). Memory held by the generation this launch replaces counts as free, since
// the verified stop releases it first. It says nothing (fits) when it cannot tell: no
// GPU or NVML, a model path that is not a local directory, a server in a container
// (whose model path is the container's), preflight = "off".
func (s *Server) preflight(ctx context.Context, prev *serverRecord) (msg string, fits bool) {
	if s.preflightMode == "off" || s.container != "" || s.host.GPU == nil {
		return "", true
	}
	dir := s.flagValue("model-path", "model")
	weights := weightBytes(dir)
	if weights == 0 {
		return "", true
	}
	info, err := s.host.GPU.Observe(ctx)
	if err != nil || info.State != gpu.StateOK {
		return "", true
	}
	if prev != nil {
		for i := range info.GPUs {
			for _, p := range info.GPUs[i].Processes {
				if s.heldBy(prev, p.PID) {
					info.GPUs[i].MemoryFree += p.UsedMemory
				}
			}
		}
	}
	tp := 1
	if v := s.flagValue("tp-size", "tensor-parallel-size", "tp"); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			tp = n
		}
	}
	frac := 0.9 // SGLang picks its own default by GPU size; 0.9 is the usual upper end
	if v := s.flagValue("mem-fraction-static", "gpu-memory-utilization"); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			frac = f
		}
	}
	var gpus []int
	if cvd := strings.TrimSpace(s.env["CUDA_VISIBLE_DEVICES"]); cvd != "" {
		for _, part := range strings.Split(cvd, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(part))
			if err != nil {
				gpus = nil // UUIDs or MIG names: let Preflight take the first tp
				break
			}
			gpus = append(gpus, n)
		}
	}
	res, err := gpu.Preflight(info, weights, tp, frac, gpus)
	switch {
	case errors.Is(err, gpu.ErrMemoryUnknown):
		return "", true
	case err != nil:
		return err.Error(), false
	}
	return res.Message, res.Fits
}

// heldBy reports whether pid belongs to the recorded server (its leader, group or session).
func (s *Server) heldBy(rec *serverRecord, pid int) bool {
	if pid == rec.PID {
		return true
	}
	st, err := s.host.Proc.Stat(pid)
	return err == nil && ((rec.PGID > 0 && st.PGRP == rec.PGID) || (rec.SID > 0 && st.Session == rec.SID))
}

// flagValue returns the rendered value of the first of names the server sets ("" if none).
func (s *Server) flagValue(names ...string) string {
	for _, n := range names {
		for _, f := range s.flags {
			if f.name == n && len(f.argv) == 2 {
				return f.argv[1]
			}
		}
	}
	return ""
}

// weightBytes sums the sizes of the checkpoint files a warm-up would read in dir (by
// stat: nothing is read), or 0 when dir is not a local directory.
func weightBytes(dir string) uint64 {
	files, _ := warm.WeightFiles(dir)
	var total uint64
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && warm.Checkpoint(f) {
			total += uint64(fi.Size())
		}
	}
	return total
}
