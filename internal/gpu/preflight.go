package gpu

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/agent-dev/agent/internal/bytesize"
)

// ErrMemoryUnknown is wrapped by Preflight's error when the observation
// cannot tell free memory: NVML did not answer (no library, no driver, a
// version mismatch) or the Info came from ProcFS. A caller in "warn" mode
// reports it and launches; in "enforce" mode it refuses.
var ErrMemoryUnknown = errors.New("free GPU memory is not known")

// PreflightGPU is the arithmetic for one selected GPU.
type PreflightGPU struct {
	Index  int
	Total  uint64 // bytes
	Free   uint64 // bytes, as observed
	Budget uint64 // Free × the memory fraction: what the server may take
	Need   uint64 // the weights' share: weights / tensor-parallel size
	Fits   bool   // Need <= Budget
	// Holders are the compute processes holding memory on this GPU, so a
	// refusal can name who is in the way.
	Holders []Process
}

// PreflightResult is the answer of Preflight: whether the weights fit, the
// numbers per selected GPU and one message for the operator.
type PreflightResult struct {
	Fits    bool
	Weights uint64 // bytes, all shards together
	TP      int
	// PerGPU is Weights / TP, rounded up: what each selected GPU must hold.
	PerGPU   uint64
	Fraction float64
	GPUs     []PreflightGPU
	// Message is one line: the arithmetic, and for a GPU where it does not
	// fit, who holds its memory and the fix.
	Message string
}

// Preflight checks, before a launch, that a model's weights fit on the GPUs
// it is given. With tensor parallelism tp the weights are split evenly, so
// each selected GPU must hold weightsBytes/tp; it may use memFraction of its
// free memory (SGLang's --mem-fraction-static, vLLM's
// --gpu-memory-utilization). The check is
//
//	weightsBytes / tp  <=  free(gpu) × memFraction   for every selected GPU
//
// gpus are NVML indices; nil selects GPUs 0..tp-1. It is a necessary
// condition, not a sufficient one: the KV cache, CUDA graphs and activations
// need memory beyond the weights, which is why the check uses the fraction
// the server will itself respect.
//
// An error means the check could not be made: bad arguments, a GPU index
// that does not exist, fewer GPUs than tp, or free memory not known (wrapping
// ErrMemoryUnknown). A result with Fits false is not an error: the caller
// decides whether to warn or refuse.
func Preflight(info Info, weightsBytes uint64, tp int, memFraction float64, gpus []int) (PreflightResult, error) {
	r := PreflightResult{Weights: weightsBytes, TP: tp, Fraction: memFraction}
	switch {
	case tp < 1:
		return r, fmt.Errorf("gpu: preflight: tensor-parallel size %d: must be at least 1", tp)
	case math.IsNaN(memFraction) || memFraction <= 0 || memFraction > 1:
		return r, fmt.Errorf("gpu: preflight: memory fraction %v: must be in (0, 1]", memFraction)
	}
	if gpus == nil {
		for i := range tp {
			gpus = append(gpus, i)
		}
	}
	if len(gpus) < tp {
		return r, fmt.Errorf("gpu: preflight: tensor-parallel size %d needs %d GPUs, %d selected (%s)", tp, tp, len(gpus), formatIndices(gpus))
	}
	if info.State != StateOK || info.Source != SourceNVML {
		why := info.State.String()
		if info.State == StateOK {
			why = "read from " + info.Source + ", which cannot see memory"
		}
		return r, fmt.Errorf("gpu: preflight: %w (%s)", ErrMemoryUnknown, why)
	}
	r.PerGPU = weightsBytes / uint64(tp)
	if weightsBytes%uint64(tp) != 0 {
		r.PerGPU++
	}
	r.Fits = true
	for n, idx := range gpus {
		if slices.Contains(gpus[:n], idx) {
			return r, fmt.Errorf("gpu: preflight: GPU %d selected twice (%s)", idx, formatIndices(gpus))
		}
		i := slices.IndexFunc(info.GPUs, func(d Device) bool { return d.Index == idx })
		if i < 0 {
			return r, fmt.Errorf("gpu: preflight: no GPU %d on this host (%d GPUs)", idx, len(info.GPUs))
		}
		d := info.GPUs[i]
		if d.MemoryTotal == 0 {
			return r, fmt.Errorf("gpu: preflight: GPU %d: %w", idx, ErrMemoryUnknown)
		}
		g := PreflightGPU{Index: idx, Total: d.MemoryTotal, Free: d.MemoryFree, Need: r.PerGPU, Holders: d.Processes}
		g.Budget = uint64(float64(d.MemoryFree) * memFraction)
		g.Fits = g.Need <= g.Budget
		r.Fits = r.Fits && g.Fits
		r.GPUs = append(r.GPUs, g)
	}
	r.Message = r.message()
	return r, nil
}

func (r PreflightResult) message() string {
	var b strings.Builder
	fmt.Fprintf(&b, "weights %s / tp %d = %s per GPU", bytesize.Format(r.Weights), r.TP, bytesize.Format(r.PerGPU))
	for _, g := range r.GPUs {
		verdict := "fits"
		if !g.Fits {
			verdict = "does not fit"
		}
		fmt.Fprintf(&b, "; GPU %d: free %s of %s × %g = %s: %s", g.Index, bytesize.Format(g.Free), bytesize.Format(g.Total),
			r.Fraction, bytesize.Format(g.Budget), verdict)
		if !g.Fits && len(g.Holders) > 0 {
			b.WriteString(" (held by ")
			for i, p := range g.Holders {
				if i > 0 {
					b.WriteString(", ")
				}
				fmt.Fprintf(&b, "pid %d: %s", p.PID, bytesize.Format(p.UsedMemory))
			}
			b.WriteString(")")
		}
	}
	if !r.Fits {
		b.WriteString(" — free the GPU, raise the tensor-parallel size (more GPUs), or use a smaller or quantised model")
	}
	return b.String()
}

func formatIndices(idx []int) string {
	if len(idx) == 0 {
		return "none"
	}
	parts := make([]string, len(idx))
	for i, n := range idx {
		parts[i] = fmt.Sprint(n)
	}
	return strings.Join(parts, ", ")
}
