//go:build cgo

package gpu

import (
	"context"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// faultGPU is one mocked GPU whose health the test sets between polls.
type faultGPU struct {
	mu                 sync.Mutex
	bus                uint32
	lost               bool
	eccVol, eccAgg     uint64
	pending, failed    bool
	noRemap, retiredOn bool
	recovery           nvml.DeviceGpuRecoveryAction
	registered         uint64
}

func (g *faultGPU) device(uuid string) *mock.Device {
	lost := func() nvml.Return {
		if g.lost {
			return nvml.ERROR_GPU_IS_LOST
		}
		return nvml.SUCCESS
	}
	d := &mock.Device{}
	d.GetUUIDFunc = func() (string, nvml.Return) { g.mu.Lock(); defer g.mu.Unlock(); return uuid, lost() }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		var p nvml.PciInfo
		copy(p.BusId[:], []int8{'0', '0', '0', '0', '0', '0', '0', '0', ':', hex(g.bus >> 4), hex(g.bus & 15), ':', '0', '0', '.', '0'})
		return p, lost()
	}
	d.GetTotalEccErrorsFunc = func(_ nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if c == nvml.VOLATILE_ECC {
			return g.eccVol, lost()
		}
		return g.eccAgg, lost()
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.noRemap {
			return 0, 0, false, false, nvml.ERROR_NOT_SUPPORTED
		}
		return 0, 1, g.pending, g.failed, lost()
	}
	d.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.retiredOn {
			return nvml.FEATURE_ENABLED, lost()
		}
		return nvml.FEATURE_DISABLED, lost()
	}
	d.GetFieldValuesFunc = func(v []nvml.FieldValue) nvml.Return {
		g.mu.Lock()
		defer g.mu.Unlock()
		binary.LittleEndian.PutUint64(v[0].Value[:], uint64(g.recovery))
		return lost()
	}
	d.RegisterEventsFunc = func(types uint64, _ nvml.EventSet) nvml.Return {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.registered = types
		return nvml.SUCCESS
	}
	return d
}

func hex(n uint32) int8 { return int8("0123456789ABCDEF"[n]) }

// NVMLHealth reads each GPU's ECC, remapping, retired pages, recovery action and
// "lost" through go-nvml's mock, and turns the XidCriticalError events NVML sends into
// faults placed on their GPU.
func TestNVMLHealth(t *testing.T) {
	g0, g1 := &faultGPU{bus: 0x01}, &faultGPU{bus: 0x41}
	d0, d1 := g0.device("GPU-aaaa"), g1.device("GPU-bbbb")
	var mu sync.Mutex
	var queue []nvml.EventData
	set := &mock.EventSet{
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			if len(queue) == 0 {
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			e := queue[0]
			queue = queue[1:]
			return e, nvml.SUCCESS
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 2, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return []nvml.Device{d0, d1}[i], nvml.SUCCESS },
		EventSetCreateFunc:         func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS },
	}
	at := time.Unix(100, 0)
	w := &FaultWatch{Root: t.TempDir(), Health: NewNVMLHealth(lib, func() time.Time { return at })}
	ctx := context.Background()

	faults, hs, err := w.Poll(ctx, twoGPUs)
	if err != nil || len(faults) != 0 || len(hs) != 2 {
		t.Fatalf("healthy: %+v %+v %v", faults, hs, err)
	}
	if hs[1].PCIBusID != "0000:41:00.0" || hs[1].UUID != "GPU-bbbb" || !hs[1].ECCKnown || !hs[1].RemapKnown || len(hs[1].Problems(at)) != 0 {
		t.Errorf("GPU 1 healthy: %+v", hs[1])
	}
	if g0.registered != nvml.EventTypeXidCriticalError {
		t.Errorf("GPU 0 registered for %#x, want XidCriticalError", g0.registered)
	}

	g0.mu.Lock()
	g0.eccVol, g0.eccAgg, g0.pending, g0.recovery = 2, 5, true, nvml.GPU_RECOVERY_ACTION_GPU_RESET
	g0.mu.Unlock()
	g1.mu.Lock()
	g1.noRemap, g1.retiredOn = true, true
	g1.mu.Unlock()
	mu.Lock()
	queue = append(queue, nvml.EventData{Device: d1, EventType: nvml.EventTypeXidCriticalError, EventData: 79})
	mu.Unlock()
	faults, hs, err = w.Poll(ctx, twoGPUs)
	if err != nil {
		t.Fatal(err)
	}
	if len(faults) != 1 || faults[0].Xid != 79 || faults[0].GPU != 1 || faults[0].Action != ActionReboot || faults[0].Source != "nvml" ||
		faults[0].Text != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" || !faults[0].At.Equal(at) {
		t.Errorf("event: %+v", faults)
	}
	h0 := hs[0]
	if h0.ECCVolatile != 2 || h0.ECCAggregate != 5 || !h0.RemapPending || h0.Recovery != ActionResetGPU || h0.RecoveryText != "GPU Reset Required" {
		t.Errorf("GPU 0: %+v", h0)
	}
	if hs[1].RemapKnown || !hs[1].RetiredKnown || !hs[1].RetiredPending {
		t.Errorf("GPU 1 without row remapping reads retired pages: %+v", hs[1])
	}

	g1.mu.Lock()
	g1.lost = true
	g1.mu.Unlock()
	_, hs, err = w.Poll(ctx, twoGPUs)
	if err != nil || !hs[1].Lost || hs[1].Problems(at)[0].Kind != FaultLost {
		t.Errorf("a lost GPU: %+v %v", hs[1], err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if len(lib.InitCalls()) != 1 || len(lib.ShutdownCalls()) != 1 || len(set.FreeCalls()) != 1 {
		t.Errorf("Init %d, Shutdown %d, Free %d: want NVML kept up across polls, then released once",
			len(lib.InitCalls()), len(lib.ShutdownCalls()), len(set.FreeCalls()))
	}
}

// After a failed Init no NVML call follows, and the kernel log is still read.
func TestNVMLHealthInitFails(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	root, write := faultRoot(t, 0)
	write("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n")
	w := &FaultWatch{Root: root, Health: NewNVMLHealth(lib, nil)}
	faults, hs, err := w.Poll(context.Background(), twoGPUs)
	if err != nil || len(faults) != 1 || hs != nil {
		t.Fatalf("%+v %+v %v", faults, hs, err)
	}
	if n := callsAfterInit(lib); n != 0 {
		t.Errorf("%d NVML calls after the failed Init", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
