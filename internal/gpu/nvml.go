//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVML observes the driver and GPUs through NVML. Production passes
// nvml.New(), which loads libnvidia-ml.so.1 at Init; tests pass go-nvml's
// mock.Interface or a simulated server such as dgxh200.New().
//
// Each Observe calls Init, reads everything, and calls Shutdown. After a
// failed Init it makes no further NVML call: NVML may abort the process.
type NVML struct {
	lib nvml.Interface
}

var _ Observer = (*NVML)(nil)

// NewNVML returns an Observer over lib.
func NewNVML(lib nvml.Interface) *NVML {
	return &NVML{lib: lib}
}

// Default returns the Observer the agent uses: NVML through
// libnvidia-ml.so.1, falling back to ProcFS under root when NVML cannot
// answer. Info.Source says which one did.
func Default(root string) Observer {
	return fallback{primary: NewNVML(nvml.New()), procfs: ProcFS{Root: root}}
}

// DefaultHealth is the HealthSource the agent uses on a real host: NVML through
// libnvidia-ml.so.1.
func DefaultHealth() HealthSource { return NewNVMLHealth(nvml.New(), nil) }

// Observe implements Observer. A panic inside NVML (or a mock) becomes an
// error; Shutdown still runs when Init succeeded.
func (n *NVML) Observe(ctx context.Context) (info Info, err error) {
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("gpu: nvml: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			info, err = Info{}, fmt.Errorf("gpu: nvml: panic: %v", r)
		}
	}()

	info.Source = SourceNVML
	if ret := n.lib.Init(); ret != nvml.SUCCESS {
		// No NVML call may follow a failed Init, ErrorString included.
		info.State = stateOf(ret)
		info.StateDetail = "nvml init: " + describe(ret)
		return info, nil
	}
	defer func() {
		if ret := n.lib.Shutdown(); ret != nvml.SUCCESS && err == nil {
			err = fmt.Errorf("gpu: nvml shutdown: %s", describe(ret))
		}
	}()
	return n.read(ctx, info)
}

// read collects everything after a successful Init.
func (n *NVML) read(ctx context.Context, info Info) (Info, error) {
	fail := func(ret nvml.Return, what string) (Info, error) {
		info.State = stateOf(ret)
		info.StateDetail = "nvml " + what + ": " + describe(ret)
		return info, nil
	}

	v, ret := n.lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return fail(ret, "driver version")
	}
	info.DriverVersion = v
	if cuda, ret := n.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && cuda > 0 {
		info.CUDADriverVersion = fmt.Sprintf("%d.%d", cuda/1000, cuda%1000/10)
	} else if ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		return fail(ret, "CUDA driver version")
	}

	count, ret := n.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fail(ret, "device count")
	}
	if count == 0 {
		info.State = StateNoGPU
		info.StateDetail = "nvml: driver " + info.DriverVersion + " sees no GPU"
		return info, nil
	}

	for i := range count {
		if err := ctx.Err(); err != nil {
			return Info{}, fmt.Errorf("gpu: nvml: %w", err)
		}
		d, ret := n.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fail(ret, fmt.Sprintf("GPU %d handle", i))
		}
		dev, what, ret := readDevice(i, d)
		if ret != nvml.SUCCESS {
			return fail(ret, fmt.Sprintf("GPU %d %s", i, what))
		}
		info.GPUs = append(info.GPUs, dev)
	}
	info.State = StateOK
	return info, nil
}

// readDevice reads one GPU; on failure it names what failed.
func readDevice(index int, d nvml.Device) (Device, string, nvml.Return) {
	dev := Device{Index: index}
	var ret nvml.Return
	if dev.Name, ret = d.GetName(); ret != nvml.SUCCESS {
		return dev, "name", ret
	}
	if dev.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return dev, "UUID", ret
	}
	pci, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return dev, "PCI info", ret
	}
	dev.PCIBusID = pciBusID(pci)

	switch mem, ret := d.GetMemoryInfo(); ret {
	case nvml.SUCCESS:
		dev.MemoryTotal, dev.MemoryUsed, dev.MemoryFree = mem.Total, mem.Used, mem.Free
	case nvml.ERROR_NOT_SUPPORTED: // e.g. GPUs with unified memory
	default:
		return dev, "memory info", ret
	}

	switch mode, ret := d.GetPersistenceMode(); ret {
	case nvml.SUCCESS:
		on := mode == nvml.FEATURE_ENABLED
		dev.PersistenceMode = &on
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return dev, "persistence mode", ret
	}

	procs, ret := d.GetComputeRunningProcesses()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		procs = nil
	default:
		return dev, "compute processes", ret
	}
	for _, p := range procs {
		used := p.UsedGpuMemory
		if used == math.MaxUint64 { // NVML_VALUE_NOT_AVAILABLE
			used = 0
		}
		dev.Processes = append(dev.Processes, Process{PID: int(p.Pid), UsedMemory: used})
	}
	slices.SortFunc(dev.Processes, func(a, b Process) int { return a.PID - b.PID })
	return dev, "", nvml.SUCCESS
}

// pciBusID takes NVML's bus id string, or builds one from the numeric
// fields when the string is empty.
func pciBusID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) == 0 {
		return fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
	}
	return NormalizePCIBusID(string(b))
}

// stateOf maps an NVML return code to a State.
func stateOf(ret nvml.Return) State {
	switch ret {
	case nvml.SUCCESS:
		return StateOK
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return StateNoLibrary
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return StateNoDriver
	case nvml.ERROR_NO_PERMISSION:
		return StateNoPermission
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return StateVersionMismatch
	case nvml.ERROR_GPU_NOT_FOUND:
		return StateNoGPU
	default:
		return StateError
	}
}

// describe names a return code without calling into NVML: after a failed
// Init, nvml.ErrorString (and Return.Error, which calls it once the library
// is loaded) must not be used.
func describe(ret nvml.Return) string {
	text, ok := returnTexts[ret]
	if !ok {
		return fmt.Sprintf("NVML return code %d", int32(ret))
	}
	return text
}

var returnTexts = map[nvml.Return]string{
	nvml.ERROR_UNINITIALIZED:           "NVML was not initialized (ERROR_UNINITIALIZED)",
	nvml.ERROR_INVALID_ARGUMENT:        "invalid argument (ERROR_INVALID_ARGUMENT)",
	nvml.ERROR_NOT_SUPPORTED:           "not supported (ERROR_NOT_SUPPORTED)",
	nvml.ERROR_NO_PERMISSION:           "insufficient permissions (ERROR_NO_PERMISSION)",
	nvml.ERROR_NOT_FOUND:               "not found (ERROR_NOT_FOUND)",
	nvml.ERROR_INSUFFICIENT_SIZE:       "insufficient size (ERROR_INSUFFICIENT_SIZE)",
	nvml.ERROR_INSUFFICIENT_POWER:      "insufficient external power (ERROR_INSUFFICIENT_POWER)",
	nvml.ERROR_DRIVER_NOT_LOADED:       "driver not loaded (ERROR_DRIVER_NOT_LOADED)",
	nvml.ERROR_TIMEOUT:                 "timeout (ERROR_TIMEOUT)",
	nvml.ERROR_IRQ_ISSUE:               "interrupt request issue (ERROR_IRQ_ISSUE)",
	nvml.ERROR_LIBRARY_NOT_FOUND:       "libnvidia-ml.so.1 not found (ERROR_LIBRARY_NOT_FOUND)",
	nvml.ERROR_FUNCTION_NOT_FOUND:      "function not found in libnvidia-ml (ERROR_FUNCTION_NOT_FOUND)",
	nvml.ERROR_CORRUPTED_INFOROM:       "corrupted infoROM (ERROR_CORRUPTED_INFOROM)",
	nvml.ERROR_GPU_IS_LOST:             "GPU is lost (ERROR_GPU_IS_LOST)",
	nvml.ERROR_RESET_REQUIRED:          "GPU requires a reset (ERROR_RESET_REQUIRED)",
	nvml.ERROR_OPERATING_SYSTEM:        "operating system call failed (ERROR_OPERATING_SYSTEM)",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH: "Driver/library version mismatch (ERROR_LIB_RM_VERSION_MISMATCH)",
	nvml.ERROR_IN_USE:                  "in use (ERROR_IN_USE)",
	nvml.ERROR_MEMORY:                  "insufficient memory (ERROR_MEMORY)",
	nvml.ERROR_NO_DATA:                 "no data (ERROR_NO_DATA)",
	nvml.ERROR_GPU_NOT_FOUND:           "GPU not found (ERROR_GPU_NOT_FOUND)",
	nvml.ERROR_UNKNOWN:                 "unknown error (ERROR_UNKNOWN)",
}
