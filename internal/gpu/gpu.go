package gpu

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Sources of an Info: which implementation answered.
const (
	SourceNVML   = "nvml"
	SourceProcFS = "procfs"
)

// Observer observes the host's NVIDIA driver and GPUs.
//
// Observe reports "no library", "no driver", "no GPU", "no permission" and a
// version mismatch as Info.State, never as an error and never by panicking.
// An error means something truly unexpected, such as a cancelled context.
type Observer interface {
	Observe(ctx context.Context) (Info, error)
}

// Info is one observation of the driver and the GPUs.
//
// When State is not StateOK, the other fields hold whatever could be read
// before the failure (often nothing), and StateDetail says what failed.
type Info struct {
	State       State
	StateDetail string // what exactly was seen, e.g. the NVML return code; empty when there is nothing to add

	// DriverVersion is the loaded kernel module's version, e.g. "580.95.05".
	DriverVersion string
	// CUDADriverVersion is the newest CUDA version the driver supports,
	// e.g. "12.8"; empty when not known (ProcFS cannot see it).
	CUDADriverVersion string

	// GPUs in NVML index order (PCI bus order for ProcFS).
	GPUs []Device

	// Source is SourceNVML or SourceProcFS. With SourceProcFS, memory,
	// persistence mode and processes are not known.
	Source string
}

// Device is one GPU.
type Device struct {
	Index int
	Name  string
	UUID  string // "GPU-…"; empty when the driver does not know it yet
	// PCIBusID is normalised: lower case, 4-digit domain,
	// "domain:bus:device.function", e.g. "0000:01:00.0".
	PCIBusID string

	MemoryTotal uint64 // bytes; 0 when not known
	MemoryUsed  uint64 // bytes
	MemoryFree  uint64 // bytes

	PersistenceMode *bool // nil when not known or not supported

	Processes []Process // compute processes with a context on this GPU, by PID
}

// Process is a compute process holding memory on a GPU. PIDs are in the PID
// namespace of the observer (the host's, for processes inside containers).
type Process struct {
	PID        int
	UsedMemory uint64 // bytes; 0 when the driver cannot tell
}

// NormalizePCIBusID turns the forms NVML, sysfs and Incus use into one:
// lower case "dddd:bb:dd.f". NVML's "00000000:1B:00.0" becomes
// "0000:1b:00.0"; a bare "1b:00.0" gets domain 0. A string that is not a
// PCI address is returned trimmed and lower-cased.
func NormalizePCIBusID(s string) string {
	id, _ := parsePCIBusID(s)
	return id
}

// parsePCIBusID is NormalizePCIBusID, and whether s was a PCI address at all.
func parsePCIBusID(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(strings.TrimRight(s, "\x00")))
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return s, false
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return s, false
	}
	domain, err1 := strconv.ParseUint(parts[0], 16, 32)
	bus, err2 := strconv.ParseUint(parts[1], 16, 8)
	dev, err3 := strconv.ParseUint(devFn[0], 16, 8)
	fn, err4 := strconv.ParseUint(devFn[1], 16, 8)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || dev > 0x1f || fn > 7 {
		return s, false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn), true
}
