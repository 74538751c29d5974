package gpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// twoA6000 is two 48 GiB GPUs: GPU 0 empty, GPU 1 with 24 GiB held by pid 4242.
func twoA6000() Info {
	const total = 48 << 30
	return Info{State: StateOK, Source: SourceNVML, DriverVersion: "580.95.05", GPUs: []Device{
		{Index: 0, MemoryTotal: total, MemoryUsed: 0, MemoryFree: total},
		{Index: 1, MemoryTotal: total, MemoryUsed: 24 << 30, MemoryFree: total - 24<<30,
			Processes: []Process{{PID: 4242, UsedMemory: 24 << 30}}},
	}}
}

func TestPreflight(t *testing.T) {
	t.Parallel()
	const gib = 1 << 30
	for _, tc := range []struct {
		name     string
		weights  uint64
		tp       int
		fraction float64
		gpus     []int
		fits     bool
		perGPU   uint64
		budgets  []uint64
		msg      []string
		empty    bool // both GPUs empty
	}{
		{
			// The field report: 52 GB BF16 over two A6000 at 0.85, both empty.
			name: "qwen 52 GiB tp2 fits", weights: 52 * gib, tp: 2, fraction: 0.85, gpus: []int{0, 1}, empty: true,
			fits: true, perGPU: 26 * gib, budgets: []uint64{mul(48*gib, 0.85), mul(48*gib, 0.85)},
			msg: []string{"weights 52.0 GiB / tp 2 = 26.0 GiB per GPU", "GPU 0: free 48.0 GiB of 48.0 GiB × 0.85 = 40.8 GiB: fits"},
		},
		{
			name: "second GPU held by someone else", weights: 52 * gib, tp: 2, fraction: 0.85, gpus: []int{0, 1},
			fits: false, perGPU: 26 * gib, budgets: []uint64{mul(48*gib, 0.85), mul(24*gib, 0.85)},
			msg: []string{"GPU 1: free 24.0 GiB of 48.0 GiB × 0.85 = 20.4 GiB: does not fit (held by pid 4242: 24.0 GiB)",
				"free the GPU, raise the tensor-parallel size"},
		},
		{
			name: "nil selects the first tp GPUs", weights: 30 * gib, tp: 1, fraction: 0.9, gpus: nil,
			fits: true, perGPU: 30 * gib, budgets: []uint64{mul(48*gib, 0.9)},
		},
		{
			name: "tp1 too big", weights: 52 * gib, tp: 1, fraction: 0.85, gpus: []int{0},
			fits: false, perGPU: 52 * gib, budgets: []uint64{mul(48*gib, 0.85)},
			msg: []string{"does not fit"},
		},
		{
			name: "odd bytes round up", weights: 3, tp: 2, fraction: 1, gpus: []int{0, 1},
			fits: true, perGPU: 2, budgets: []uint64{48 * gib, 24 * gib},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			info := twoA6000()
			if tc.empty {
				info.GPUs[1] = info.GPUs[0]
				info.GPUs[1].Index = 1
			}
			r, err := Preflight(info, tc.weights, tc.tp, tc.fraction, tc.gpus)
			if err != nil {
				t.Fatal(err)
			}
			if r.Fits != tc.fits || r.PerGPU != tc.perGPU {
				t.Errorf("Fits %v PerGPU %d, want %v %d; %s", r.Fits, r.PerGPU, tc.fits, tc.perGPU, r.Message)
			}
			var budgets []uint64
			for _, g := range r.GPUs {
				budgets = append(budgets, g.Budget)
				if g.Need != tc.perGPU || g.Fits != (g.Need <= g.Budget) {
					t.Errorf("GPU %d: %+v", g.Index, g)
				}
			}
			if diff := cmp.Diff(tc.budgets, budgets); diff != "" {
				t.Errorf("budgets (-want +got):\n%s", diff)
			}
			for _, m := range tc.msg {
				if !strings.Contains(r.Message, m) {
					t.Errorf("message %q\nlacks %q", r.Message, m)
				}
			}
		})
	}
}

func TestPreflightErrors(t *testing.T) {
	t.Parallel()
	procfs := twoA6000()
	procfs.Source = SourceProcFS
	mismatch := Info{State: StateVersionMismatch, Source: SourceNVML}
	noTotal := twoA6000()
	noTotal.GPUs[0].MemoryTotal = 0
	for _, tc := range []struct {
		name     string
		info     Info
		tp       int
		fraction float64
		gpus     []int
		want     string
		unknown  bool
	}{
		{"tp zero", twoA6000(), 0, 0.85, nil, "tensor-parallel size 0: must be at least 1", false},
		{"fraction zero", twoA6000(), 1, 0, nil, "memory fraction 0: must be in (0, 1]", false},
		{"fraction above one", twoA6000(), 1, 1.5, nil, "memory fraction 1.5", false},
		{"too few GPUs", twoA6000(), 2, 0.85, []int{1}, "tensor-parallel size 2 needs 2 GPUs, 1 selected (1)", false},
		{"same GPU twice", twoA6000(), 2, 0.85, []int{1, 1}, "GPU 1 selected twice", false},
		{"no such GPU", twoA6000(), 1, 0.85, []int{7}, "no GPU 7 on this host (2 GPUs)", false},
		{"procfs", procfs, 1, 0.85, nil, "free GPU memory is not known (read from procfs, which cannot see memory)", true},
		{"mismatch", mismatch, 1, 0.85, nil, "free GPU memory is not known (version-mismatch)", true},
		{"no total", noTotal, 1, 0.85, nil, "GPU 0: free GPU memory is not known", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Preflight(tc.info, 1<<30, tc.tp, tc.fraction, tc.gpus)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if errors.Is(err, ErrMemoryUnknown) != tc.unknown {
				t.Errorf("errors.Is(err, ErrMemoryUnknown) = %v, want %v", !tc.unknown, tc.unknown)
			}
		})
	}
}

func mul(b uint64, f float64) uint64 { return uint64(float64(b) * f) }
