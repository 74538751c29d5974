//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLHealth is the HealthSource over NVML: per GPU the uncorrectable ECC counts, row
// remapping (or, on older GPUs, retired pages pending), the driver's recovery action,
// "GPU is lost" and "reset required", and the XidCriticalError events NVML sends. It
// initialises NVML on first use and keeps it (the event set lives as long as NVML is
// initialised); after a failed Init it makes no NVML call and reports nothing, and tries
// Init again at the next call.
type NVMLHealth struct {
	lib nvml.Interface
	now func() time.Time

	mu   sync.Mutex
	up   bool
	set  nvml.EventSet
	devs []nvml.Device
}

var _ HealthSource = (*NVMLHealth)(nil)

// NewNVMLHealth returns a HealthSource over lib (nvml.New() in production, go-nvml's
// mock in tests).
func NewNVMLHealth(lib nvml.Interface, now func() time.Time) *NVMLHealth {
	if now == nil {
		now = time.Now
	}
	return &NVMLHealth{lib: lib, now: now}
}

// Health implements HealthSource. A panic inside NVML becomes an error.
func (n *NVMLHealth) Health(ctx context.Context) (hs []Health, events []Fault, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			hs, events, err = nil, nil, fmt.Errorf("gpu: nvml health: panic: %v", r)
		}
	}()
	if !n.up && !n.start() {
		return nil, nil, nil
	}
	events = n.drain()
	for i, d := range n.devs {
		if ctx.Err() != nil {
			return hs, events, ctx.Err()
		}
		hs = append(hs, readHealth(i, d))
	}
	return hs, events, nil
}

// start initialises NVML, finds the GPUs and registers them for Xid events. A GPU or
// driver without events is watched by its health alone.
func (n *NVMLHealth) start() bool {
	if ret := n.lib.Init(); ret != nvml.SUCCESS {
		return false // no call may follow a failed Init
	}
	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		n.lib.Shutdown()
		return false
	}
	n.up, n.devs = true, nil
	for i := range count {
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		n.devs = append(n.devs, d)
	}
	if set, ret := n.lib.EventSetCreate(); ret == nvml.SUCCESS {
		n.set = set
		for _, d := range n.devs {
			d.RegisterEvents(nvml.EventTypeXidCriticalError, set) // NOT_SUPPORTED: health only
		}
	}
	return true
}

// drain takes every event waiting in the set, without blocking.
func (n *NVMLHealth) drain() []Fault {
	if n.set == nil {
		return nil
	}
	var out []Fault
	for range 1024 {
		e, ret := n.set.Wait(0)
		if ret != nvml.SUCCESS {
			break // ERROR_TIMEOUT: nothing more
		}
		if e.EventType&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		f := Fault{At: n.now(), Kind: FaultXid, Xid: int(e.EventData), Source: "nvml", Action: XidAction(int(e.EventData), "")}
		if e.Device != nil {
			if pci, ret := e.Device.GetPciInfo(); ret == nvml.SUCCESS {
				f.PCIBusID = pciBusID(pci)
			}
			if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
				f.UUID = uuid
			}
		}
		if x, ok := LookupXid(f.Xid); ok {
			f.Text = x.Mnemonic
		}
		out = append(out, f)
	}
	return out
}

// readHealth reads one GPU's health; what the GPU does not support stays unknown.
func readHealth(i int, d nvml.Device) Health {
	h := Health{Index: i}
	note := func(ret nvml.Return) bool {
		switch ret {
		case nvml.SUCCESS:
			return true
		case nvml.ERROR_GPU_IS_LOST:
			h.Lost = true
		case nvml.ERROR_RESET_REQUIRED:
			h.ResetRequired = true
		}
		return false
	}
	if uuid, ret := d.GetUUID(); note(ret) {
		h.UUID = uuid
	}
	if pci, ret := d.GetPciInfo(); note(ret) {
		h.PCIBusID = pciBusID(pci)
	}
	vol, ret1 := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	agg, ret2 := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)
	if note(ret1) && note(ret2) {
		h.ECCKnown, h.ECCVolatile, h.ECCAggregate = true, vol, agg
	}
	if _, _, pending, failed, ret := d.GetRemappedRows(); note(ret) {
		h.RemapKnown, h.RemapPending, h.RemapFailed = true, pending, failed
	} else if st, ret := d.GetRetiredPagesPendingStatus(); note(ret) {
		h.RetiredKnown, h.RetiredPending = true, st == nvml.FEATURE_ENABLED
	}
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := d.GetFieldValues(fv); note(ret) && nvml.Return(fv[0].NvmlReturn) == nvml.SUCCESS {
		h.Recovery, h.RecoveryText = recoveryOf(nvml.DeviceGpuRecoveryAction(fieldUint(fv[0])))
	}
	return h
}

// recoveryOf names the driver's recovery action (nvml.h, nvmlDeviceGpuRecoveryAction_t).
func recoveryOf(a nvml.DeviceGpuRecoveryAction) (Action, string) {
	switch a {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return ActionIgnore, ""
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return ActionResetGPU, "GPU Reset Required"
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return ActionReboot, "Node Reboot Required"
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return ActionRestartApp, "Drain P2P"
	case nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return ActionResetGPU, "Drain and Reset"
	}
	return ActionContactSupport, fmt.Sprintf("recovery action %d", int(a))
}

// fieldUint reads a field value's unsigned number (NVML writes it in the union's first
// bytes, little-endian).
func fieldUint(v nvml.FieldValue) uint64 {
	var u uint64
	for i := 7; i >= 0; i-- {
		u = u<<8 | uint64(v.Value[i])
	}
	return u
}

// Close frees the event set and shuts NVML down.
func (n *NVMLHealth) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.up {
		return nil
	}
	if n.set != nil {
		n.set.Free()
	}
	n.up, n.set, n.devs = false, nil, nil
	if ret := n.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpu: nvml shutdown: %s", describe(ret))
	}
	return nil
}
