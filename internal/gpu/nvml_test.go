//go:build cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"
)

// callsAfterInit counts the calls the mock recorded on everything
// NVML.Observe could call after Init. A call to a method whose Func is nil
// panics in the mock, which Observe turns into an error, so the tests that
// leave those nil prove the absence of the others too.
func callsAfterInit(m *mock.Interface) int {
	return len(m.ShutdownCalls()) + len(m.SystemGetDriverVersionCalls()) +
		len(m.SystemGetCudaDriverVersionCalls()) + len(m.DeviceGetCountCalls()) +
		len(m.DeviceGetHandleByIndexCalls()) + len(m.ErrorStringCalls())
}

// Every failed Init maps to its state, and nothing, not even Shutdown or
// ErrorString, is called after it.
func TestNVMLInitFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ret        nvml.Return
		want       State
		wantDetail string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, StateNoLibrary, "nvml init: libnvidia-ml.so.1 not found (ERROR_LIBRARY_NOT_FOUND)"},
		{nvml.ERROR_DRIVER_NOT_LOADED, StateNoDriver, "nvml init: driver not loaded (ERROR_DRIVER_NOT_LOADED)"},
		{nvml.ERROR_NO_PERMISSION, StateNoPermission, "nvml init: insufficient permissions (ERROR_NO_PERMISSION)"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, StateVersionMismatch, "nvml init: Driver/library version mismatch (ERROR_LIB_RM_VERSION_MISMATCH)"},
		{nvml.ERROR_GPU_IS_LOST, StateError, "nvml init: GPU is lost (ERROR_GPU_IS_LOST)"},
		{nvml.ERROR_UNKNOWN, StateError, "nvml init: unknown error (ERROR_UNKNOWN)"},
		{nvml.Return(4242), StateError, "nvml init: NVML return code 4242"},
	} {
		t.Run(tc.want.String()+"/"+fmt.Sprint(int32(tc.ret)), func(t *testing.T) {
			t.Parallel()
			m := &mock.Interface{InitFunc: func() nvml.Return { return tc.ret }}
			got, err := NewNVML(m).Observe(context.Background())
			if err != nil {
				t.Fatalf("Observe: %v (a call after the failed Init would panic in the mock)", err)
			}
			want := Info{State: tc.want, StateDetail: tc.wantDetail, Source: SourceNVML}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Observe (-want +got):\n%s", diff)
			}
			if n := len(m.InitCalls()); n != 1 {
				t.Errorf("Init called %d times, want 1", n)
			}
			if n := callsAfterInit(m); n != 0 {
				t.Errorf("%d NVML calls after the failed Init, want none", n)
			}
		})
	}
}

// h200Bus are the PCI bus numbers of a DGX H200's GPUs.
var h200Bus = []uint32{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

// dgx returns the simulated DGX H200 with what the simulator lacks filled
// in: NVML-style PCI bus ids ("00000000:1B:00.0"), persistence mode (off on
// GPU 7), used memory, and compute processes from procs (read under mu on
// every call, so tests can change them between observations).
func dgx(t *testing.T, mu *sync.Mutex, procs map[int][]nvml.ProcessInfo) *server.Server {
	t.Helper()
	s := dgxh200.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		var busID [32]int8
		for j, c := range fmt.Sprintf("00000000:%02X:00.0", h200Bus[i]) {
			busID[j] = int8(c)
		}
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			return nvml.PciInfo{Bus: h200Bus[i], BusId: busID, PciDeviceId: dev.Config.PciDeviceId}, nvml.SUCCESS
		}
		used := uint64(i) << 30
		dev.MemoryInfo = nvml.Memory{Total: dev.MemoryInfo.Total, Used: used, Free: dev.MemoryInfo.Total - used}
		dev.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
			if i == 7 {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return append([]nvml.ProcessInfo(nil), procs[i]...), nvml.SUCCESS
		}
	}
	return s
}

// A normal read of the 8-GPU simulated server: versions, names, UUIDs,
// normalised PCI ids, memory, persistence mode and processes; Init and
// Shutdown exactly once each.
func TestNVMLDGXH200(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	s := dgx(t, &mu, map[int][]nvml.ProcessInfo{
		0: {{Pid: 4243, UsedGpuMemory: 60 << 30}, {Pid: 4242, UsedGpuMemory: 70 << 30}},
		1: {{Pid: 4244, UsedGpuMemory: ^uint64(0)}}, // NVML_VALUE_NOT_AVAILABLE
	})
	got, err := NewNVML(s).Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}

	const total = 144384 << 20 // gpus.H200_SXM5_141GB: 144384 MiB
	want := Info{State: StateOK, DriverVersion: "550.54.15", CUDADriverVersion: "12.4", Source: SourceNVML}
	for i, d := range s.Devices {
		dev := Device{
			Index:           i,
			Name:            "NVIDIA H200 141GB HBM3e",
			UUID:            d.(*server.Device).UUID,
			PCIBusID:        fmt.Sprintf("0000:%02x:00.0", h200Bus[i]),
			MemoryTotal:     total,
			MemoryUsed:      uint64(i) << 30,
			MemoryFree:      total - uint64(i)<<30,
			PersistenceMode: ptr(i != 7),
		}
		switch i {
		case 0:
			dev.Processes = []Process{{PID: 4242, UsedMemory: 70 << 30}, {PID: 4243, UsedMemory: 60 << 30}}
		case 1:
			dev.Processes = []Process{{PID: 4244, UsedMemory: 0}}
		}
		want.GPUs = append(want.GPUs, dev)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Observe (-want +got):\n%s", diff)
	}
	if i, sd := len(s.InitCalls()), len(s.ShutdownCalls()); i != 1 || sd != 1 {
		t.Errorf("Init called %d times, Shutdown %d times; want 1 and 1", i, sd)
	}
	if got.GPUs[0].PCIBusID != "0000:18:00.0" || got.GPUs[7].PCIBusID != "0000:db:00.0" {
		t.Errorf("PCI bus ids not normalised: %q, %q", got.GPUs[0].PCIBusID, got.GPUs[7].PCIBusID)
	}
}

// Init succeeds and the driver sees no GPU: StateNoGPU, and Shutdown.
func TestNVMLNoGPU(t *testing.T) {
	t.Parallel()
	s := dgxh200.NewWithGPUs()
	got, err := NewNVML(s).Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := Info{State: StateNoGPU, StateDetail: "nvml: driver 550.54.15 sees no GPU",
		DriverVersion: "550.54.15", CUDADriverVersion: "12.4", Source: SourceNVML}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Observe (-want +got):\n%s", diff)
	}
	if n := len(s.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}

// Failures after a successful Init map to states, features a GPU does not
// support are left unknown, and Shutdown is called every time.
func TestNVMLAfterInit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		tweak      func(s *server.Server)
		wantState  State
		wantDetail string
		check      func(t *testing.T, info Info)
	}{
		{
			name: "mismatch on the driver version",
			tweak: func(s *server.Server) {
				s.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", nvml.ERROR_LIB_RM_VERSION_MISMATCH }
			},
			wantState:  StateVersionMismatch,
			wantDetail: "nvml driver version: Driver/library version mismatch (ERROR_LIB_RM_VERSION_MISMATCH)",
		},
		{
			name: "no permission to count",
			tweak: func(s *server.Server) {
				s.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NO_PERMISSION }
			},
			wantState:  StateNoPermission,
			wantDetail: "nvml device count: insufficient permissions (ERROR_NO_PERMISSION)",
		},
		{
			name: "GPU 3 lost",
			tweak: func(s *server.Server) {
				s.Devices[3].(*server.Device).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
			},
			wantState:  StateError,
			wantDetail: "nvml GPU 3 memory info: GPU is lost (ERROR_GPU_IS_LOST)",
		},
		{
			name: "handle fails",
			tweak: func(s *server.Server) {
				s.DeviceGetHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
			},
			wantState:  StateError,
			wantDetail: "nvml GPU 0 handle: unknown error (ERROR_UNKNOWN)",
		},
		{
			name: "unsupported features are unknown, not failures",
			tweak: func(s *server.Server) {
				s.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
				for _, d := range s.Devices {
					dev := d.(*server.Device)
					dev.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
					dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
					dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
				}
			},
			wantState: StateOK,
			check: func(t *testing.T, info Info) {
				if info.CUDADriverVersion != "" || len(info.GPUs) != 8 {
					t.Errorf("CUDA %q, %d GPUs; want none and 8", info.CUDADriverVersion, len(info.GPUs))
				}
				for _, d := range info.GPUs {
					if d.PersistenceMode != nil || d.Processes != nil || d.MemoryTotal != 0 {
						t.Errorf("GPU %d: %+v, want persistence, processes and memory unknown", d.Index, d)
					}
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			s := dgx(t, &mu, nil)
			tc.tweak(s)
			got, err := NewNVML(s).Observe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tc.wantState || got.StateDetail != tc.wantDetail {
				t.Errorf("Observe = %v %q, want %v %q", got.State, got.StateDetail, tc.wantState, tc.wantDetail)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
			if n := len(s.ShutdownCalls()); n != 1 {
				t.Errorf("Shutdown called %d times, want 1", n)
			}
		})
	}
}

// A panic inside NVML (here: a mock method left nil) becomes an error, and
// Shutdown still runs after the successful Init.
func TestNVMLPanicBecomesErrorAndShutsDown(t *testing.T) {
	t.Parallel()
	m := &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	_, err := NewNVML(m).Observe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "panic") {
		t.Errorf("Observe: err = %v, want a panic turned into an error", err)
	}
	if n := len(m.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
}

// A failing Shutdown is an error; the observation is still returned.
func TestNVMLShutdownFailure(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	s := dgx(t, &mu, nil)
	s.ShutdownFunc = func() nvml.Return { return nvml.ERROR_UNKNOWN }
	got, err := NewNVML(s).Observe(context.Background())
	if err == nil || !strings.Contains(err.Error(), "nvml shutdown: unknown error") {
		t.Errorf("Observe: err = %v, want the Shutdown failure", err)
	}
	if got.State != StateOK || len(got.GPUs) != 8 {
		t.Errorf("Observe = %v with %d GPUs, want ok with 8", got.State, len(got.GPUs))
	}
}

// A cancelled context: an error, and NVML is not touched.
func TestNVMLCancelledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m := &mock.Interface{}
	if _, err := NewNVML(m).Observe(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Observe: err = %v, want context.Canceled", err)
	}
	if n := len(m.InitCalls()); n != 0 {
		t.Errorf("Init called %d times, want 0", n)
	}
}

// WaitReleased against the simulated server: memory released after a few
// polls (success), and never released (an error naming the PIDs and their
// memory, at the deadline). Every poll's Init is paired with a Shutdown.
func TestNVMLWaitReleased(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		releaseAt int // the observation from which the processes are gone; 0: never
		wantErr   []string
		wantPolls int
	}{
		{name: "released late", releaseAt: 4, wantPolls: 4},
		{name: "never released", wantErr: []string{"pid 4242 holds 130.0 GiB", "pid 4243 holds 60.0 GiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			procs := map[int][]nvml.ProcessInfo{
				0: {{Pid: 4242, UsedGpuMemory: 70 << 30}},
				1: {{Pid: 4242, UsedGpuMemory: 60 << 30}, {Pid: 4243, UsedGpuMemory: 60 << 30}},
				2: {{Pid: 31337, UsedGpuMemory: 1 << 30}}, // someone else's
			}
			s := dgx(t, &mu, procs)
			polls := 0
			s.InitFunc = func() nvml.Return {
				mu.Lock()
				defer mu.Unlock()
				polls++
				if polls == tc.releaseAt {
					delete(procs, 0)
					delete(procs, 1)
				}
				return nvml.SUCCESS
			}
			// As in TestWaitReleased: a distant deadline for the success, an hour's poll
			// for the failure (the last look is at the deadline), a context to bound both.
			deadline, poll := time.Now().Add(time.Minute), 10*time.Millisecond
			if tc.wantErr != nil {
				deadline, poll = time.Now().Add(300*time.Millisecond), time.Hour
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := WaitReleased(ctx, NewNVML(s), []int{4242, 4243}, deadline, poll)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("WaitReleased: %v", err)
				}
				if len(s.InitCalls()) != tc.wantPolls {
					t.Errorf("%d polls, want %d", len(s.InitCalls()), tc.wantPolls)
				}
			} else {
				if !errors.Is(err, ErrNotReleased) {
					t.Fatalf("WaitReleased: err = %v, want ErrNotReleased", err)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				if strings.Contains(err.Error(), "31337") {
					t.Errorf("error %q names a process that is not ours", err)
				}
				if late := time.Since(deadline); late > 20*time.Second {
					t.Errorf("returned %v after the deadline, want at it (not a poll interval later)", late)
				}
				if n := len(s.InitCalls()); n != 2 {
					t.Errorf("%d polls, want 2: at the start and at the deadline", n)
				}
			}
			if i, sd := len(s.InitCalls()), len(s.ShutdownCalls()); i != sd {
				t.Errorf("Init called %d times, Shutdown %d times; want them paired", i, sd)
			}
		})
	}
}

// The real library, wherever the test runs: no crash, no error, a state.
// Without libnvidia-ml.so.1 (the usual test machine) that state is
// no-library, and Default falls back to procfs under the given root.
func TestNVMLRealLibrary(t *testing.T) {
	t.Parallel()
	info, err := NewNVML(nvml.New()).Observe(context.Background())
	if err != nil {
		t.Fatalf("Observe: %v", err)
	}
	t.Logf("real NVML: %v (%s), driver %q, CUDA %q, %d GPUs", info.State, info.StateDetail, info.DriverVersion, info.CUDADriverVersion, len(info.GPUs))
	for _, d := range info.GPUs {
		t.Logf("  GPU %d %s %s %s mem %d/%d persistence %v processes %v", d.Index, d.Name, d.UUID, d.PCIBusID, d.MemoryUsed, d.MemoryTotal, d.PersistenceMode, d.Processes)
		if d.PCIBusID != NormalizePCIBusID(d.PCIBusID) || strings.Count(d.PCIBusID, ":") != 2 {
			t.Errorf("GPU %d: PCI bus id %q not normalised", d.Index, d.PCIBusID)
		}
	}
	if info.State == StateUnknown || info.Source != SourceNVML {
		t.Errorf("Observe = %+v, want a state from nvml", info)
	}
	// A second round must work as well: Init/Shutdown (or a failed Init) twice.
	again, err := NewNVML(nvml.New()).Observe(context.Background())
	if err != nil || again.State != info.State {
		t.Errorf("second Observe = %v, %v; want %v again", again.State, err, info.State)
	}

	got, err := Default(rootFS(t, "a6000x2")).Observe(context.Background())
	if err != nil {
		t.Fatalf("Default: %v", err)
	}
	switch info.State {
	case StateOK, StateNoGPU:
		if got.Source != SourceNVML {
			t.Errorf("Default: source %q, want nvml when NVML works", got.Source)
		}
	case StateNoLibrary:
		if got.Source != SourceProcFS || got.State != StateOK || len(got.GPUs) != 2 || got.DriverVersion != "580.95.05" {
			t.Errorf("Default without the library = %+v, want the a6000x2 tree read through procfs", got)
		}
	}
}
