// Package gpu observes the NVIDIA driver and the GPUs of a host: the loaded
// kernel module's version, the CUDA version the driver supports, and per GPU
// its name, UUID, PCI bus id, memory and the compute processes holding memory
// on it.
//
// The rest of the agent sees one small interface, Observer. The
// nvidia_driver resource compares what it observes with the plan; the server
// resource uses ProcessesUsing and WaitReleased to prove that a stopped
// server's GPU memory was released before it relaunches.
//
// Two implementations exist. NVML wraps github.com/NVIDIA/go-nvml (cgo, and
// libnvidia-ml.so.1 loaded at run time); ProcFS reads
// /proc/driver/nvidia and /sys/module/nvidia under a root that tests move to
// a fake tree, and needs neither cgo nor NVML. Default tries NVML and falls
// back to ProcFS, and Info.Source says which one answered. Built with
// CGO_ENABLED=0, only ProcFS exists and Default returns it.
//
// "No library", "no driver", "no GPU", "no permission" and "driver/library
// version mismatch" are states of the host, reported in Info.State with a
// message that tells the operator the fix; they are never errors and never
// crashes. An error from Observe means something truly unexpected: a
// cancelled context, or a panic inside NVML turned into an error.
//
// FaultWatch watches for GPU faults: the Xid lines of the kernel log (ParseXidLine,
// KmsgFollower), NVML's Xid events and per-GPU health (NVMLHealth: ECC, row remapping,
// retired pages, the driver's recovery action, a lost GPU), each fault given the action
// NVIDIA's Xid catalog asks for (xid_catalog.tsv, XidAction).
//
// NVML has one trap this package exists to avoid: any NVML call after a
// failed Init may kill the process. NVML.Observe therefore makes no call
// after a failed Init (not even ErrorString, whose names this package keeps
// itself) and always calls Shutdown after a successful one.
package gpu
