package gpu

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFallback(t *testing.T) {
	t.Parallel()
	nvmlOK := Info{State: StateOK, Source: SourceNVML, DriverVersion: "580.95.05", CUDADriverVersion: "13.0",
		GPUs: []Device{{Index: 0, Name: "NVIDIA H200", PCIBusID: "0000:18:00.0", MemoryTotal: 141 << 30}}}
	procOK := Info{State: StateOK, StateDetail: "read from /proc", Source: SourceProcFS, DriverVersion: "580.95.05",
		GPUs: []Device{{Index: 0, Name: "NVIDIA H200", PCIBusID: "0000:18:00.0"}}}
	procNoDriver := Info{State: StateNoDriver, StateDetail: "no version file", Source: SourceProcFS}
	for _, tc := range []struct {
		name         string
		nvml, procfs Info
		want         Info
		procfsCalled bool
	}{
		{
			name: "nvml answers", nvml: nvmlOK, procfs: procOK, want: nvmlOK,
		},
		{
			name: "nvml sees no GPU: that is the answer",
			nvml: Info{State: StateNoGPU, Source: SourceNVML}, procfs: procOK,
			want: Info{State: StateNoGPU, Source: SourceNVML},
		},
		{
			name:         "no library: procfs answers",
			nvml:         Info{State: StateNoLibrary, StateDetail: "nvml init: lib missing", Source: SourceNVML},
			procfs:       procOK,
			want:         Info{State: StateOK, StateDetail: "nvml init: lib missing; read from /proc", Source: SourceProcFS, DriverVersion: "580.95.05", GPUs: procOK.GPUs},
			procfsCalled: true,
		},
		{
			name:         "no library and no driver",
			nvml:         Info{State: StateNoLibrary, StateDetail: "nvml init: lib missing", Source: SourceNVML},
			procfs:       procNoDriver,
			want:         Info{State: StateNoDriver, StateDetail: "nvml init: lib missing; no version file", Source: SourceProcFS},
			procfsCalled: true,
		},
		{
			name:         "version mismatch keeps its state, procfs gives the loaded module",
			nvml:         Info{State: StateVersionMismatch, StateDetail: "nvml init: mismatch", Source: SourceNVML},
			procfs:       procOK,
			want:         Info{State: StateVersionMismatch, StateDetail: "nvml init: mismatch; read from /proc", Source: SourceProcFS, DriverVersion: "580.95.05", GPUs: procOK.GPUs},
			procfsCalled: true,
		},
		{
			name:         "no driver from both",
			nvml:         Info{State: StateNoDriver, StateDetail: "nvml init: not loaded", Source: SourceNVML},
			procfs:       procNoDriver,
			want:         Info{State: StateNoDriver, StateDetail: "nvml init: not loaded; procfs: no-driver; no version file", Source: SourceProcFS},
			procfsCalled: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := &script{answers: []Info{tc.procfs}}
			got, err := fallback{primary: &script{answers: []Info{tc.nvml}}, procfs: p}.Observe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Observe (-want +got):\n%s", diff)
			}
			if called := p.Calls() > 0; called != tc.procfsCalled {
				t.Errorf("procfs called: %v, want %v", called, tc.procfsCalled)
			}
		})
	}
}

func TestFallbackErrors(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	failing := observerFunc(func(context.Context) (Info, error) { return Info{}, boom })
	noLib := &script{answers: []Info{{State: StateNoLibrary, StateDetail: "lib missing", Source: SourceNVML}}}

	// An unexpected NVML error is returned, not papered over.
	if _, err := (fallback{primary: failing, procfs: noLib}).Observe(context.Background()); !errors.Is(err, boom) {
		t.Errorf("primary error: got %v, want boom", err)
	}
	// A procfs error keeps NVML's verdict and says what procfs hit.
	got, err := fallback{primary: noLib, procfs: failing}.Observe(context.Background())
	if err != nil || got.State != StateNoLibrary || got.StateDetail != "lib missing; procfs: boom" {
		t.Errorf("procfs error: got %+v, %v", got, err)
	}
}
