package gpu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Fault is one fault seen on a GPU: an Xid from the kernel log or NVML, or a health
// condition NVML reports (docs/gpu.md, "When a GPU fails").
type Fault struct {
	At       time.Time `json:"at"`
	PCIBusID string    `json:"pci_bus_id"` // normalised: "0000:41:00.0"
	GPU      int       `json:"gpu"`        // the GPU's index; -1 when the host has no GPU at PCIBusID
	UUID     string    `json:"uuid"`
	Kind     string    `json:"kind"` // one of the Fault* kinds
	Xid      int       `json:"xid"`  // 0 unless Kind is FaultXid
	PID      int       `json:"pid"`  // the process the driver named; 0 when none
	Process  string    `json:"process"`
	Text     string    `json:"text"`   // for people: "GPU has fallen off the bus.", "row remapping failed"
	Line     string    `json:"line"`   // the kernel log's line, as the kernel wrote it ("" from NVML)
	Source   string    `json:"source"` // "kmsg" or "nvml"
	Seq      uint64    `json:"seq"`    // the kernel log's sequence number; 0 when it has none
	Action   Action    `json:"action"`
}

// The kinds of Fault.
const (
	FaultXid            = "xid"
	FaultLost           = "gpu-lost"
	FaultResetRequired  = "reset-required"
	FaultRemapPending   = "remap-pending"
	FaultRemapFailed    = "remap-failed"
	FaultRetiredPending = "retired-pages-pending"
	FaultRecovery       = "recovery-action"
	FaultResetFailed    = "reset-failed" // the agent's reset could not be done or did not help
)

// FaultKinds are the kinds of Fault, in the order the --json schema lists them.
var FaultKinds = []string{FaultXid, FaultLost, FaultResetRequired, FaultRemapPending, FaultRemapFailed, FaultRetiredPending, FaultRecovery, FaultResetFailed}

// Describe is the fault for people: "Xid 79 at 10:04:05: GPU has fallen off the bus."
func (f Fault) Describe() string {
	what := f.Text
	if f.Kind == FaultXid {
		what = fmt.Sprintf("Xid %d", f.Xid)
		if f.Text != "" {
			what += ": " + f.Text
		}
	}
	return what
}

// Health is what NVML says of one GPU's health now. The zero value knows nothing.
type Health struct {
	Index    int    `json:"gpu"`
	PCIBusID string `json:"pci_bus_id"`
	UUID     string `json:"uuid"`

	Lost          bool `json:"lost"`           // NVML: GPU is lost (fallen off the bus)
	ResetRequired bool `json:"reset_required"` // NVML: the GPU requires a reset

	ECCKnown bool `json:"ecc_known"`
	// Uncorrectable ECC errors: since the driver loaded (volatile) and over the GPU's life
	// (aggregate).
	ECCVolatile  uint64 `json:"ecc_uncorrectable_volatile"`
	ECCAggregate uint64 `json:"ecc_uncorrectable_aggregate"`

	RemapKnown   bool `json:"remap_known"` // row remapping (Ampere and newer)
	RemapPending bool `json:"remap_pending"`
	RemapFailed  bool `json:"remap_failed"`

	RetiredKnown   bool `json:"retired_known"` // page retirement (older GPUs)
	RetiredPending bool `json:"retired_pending"`

	// Recovery is the driver's recovery action (the one Xid 154 announces) as an Action;
	// RecoveryText its name ("Node Reboot Required"); "" when the driver offers none.
	Recovery     Action `json:"recovery"`
	RecoveryText string `json:"recovery_text"`
}

// Problems are the faults Health shows now, most severe first; none for a healthy GPU.
// A pending remap or retired page waits for a reset; a failed remap or a lost GPU needs
// the machine rebooted (NVIDIA: "GPU Memory Error Management", row remapping).
func (h Health) Problems(at time.Time) []Fault {
	var out []Fault
	add := func(kind, text string, a Action) {
		out = append(out, Fault{At: at, PCIBusID: h.PCIBusID, GPU: h.Index, UUID: h.UUID, Kind: kind, Text: text, Source: "nvml", Action: a})
	}
	if h.Lost {
		add(FaultLost, "GPU is lost (fallen off the bus or otherwise inaccessible)", ActionReboot)
	}
	if h.RemapFailed {
		add(FaultRemapFailed, "row remapping failed", ActionReboot)
	}
	if h.RecoveryText != "" && h.Recovery > ActionIgnore {
		add(FaultRecovery, "driver recovery action: "+h.RecoveryText, h.Recovery)
	}
	if h.ResetRequired {
		add(FaultResetRequired, "GPU requires a reset", ActionResetGPU)
	}
	if h.RemapPending {
		add(FaultRemapPending, "row remapping pending: a reset activates it", ActionResetGPU)
	}
	if h.RetiredPending {
		add(FaultRetiredPending, "retired pages pending: a reset retires them", ActionResetGPU)
	}
	return out
}

// HealthSource reads the GPUs' health and the Xid events it was sent since the last call
// (NVML's event set). Close releases it.
type HealthSource interface {
	Health(ctx context.Context) ([]Health, []Fault, error)
	Close() error
}

// FaultWatch watches a host's GPUs for faults: the kernel log's Xid lines (Root's
// dev/kmsg; under AGENT_HOST_ROOT a regular file that grows) and, when Health is set,
// NVML's events and health. One FaultWatch is polled by one goroutine.
type FaultWatch struct {
	Root   string
	Health HealthSource     // nil: the kernel log only
	Now    func() time.Time // nil: time.Now

	kmsg  *KmsgFollower
	btime time.Time
}

// Poll returns the faults seen since the last Poll and the GPUs' health, each fault
// mapped to the GPU (index and UUID) at its PCI bus id among gpus; a fault on a bus id
// the host has no GPU at keeps GPU -1. A kernel log that cannot be read is an error
// (with what was read before it), never a crash.
func (w *FaultWatch) Poll(ctx context.Context, gpus []Device) ([]Fault, []Health, error) {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	if w.kmsg == nil {
		w.kmsg = NewKmsgFollower(filepath.Join(rootOr(w.Root), "dev", "kmsg"))
		w.btime = bootTime(rootOr(w.Root))
	}
	var faults []Fault
	err := w.kmsg.Read(func(r KmsgRecord) {
		x, ok := ParseXidLine(r.Message)
		if !ok {
			return
		}
		at := now()
		if r.Seq > 0 && !w.btime.IsZero() {
			at = w.btime.Add(time.Duration(r.Usec) * time.Microsecond)
		}
		faults = append(faults, Fault{At: at, PCIBusID: x.PCIBusID, Kind: FaultXid, Xid: x.Code, PID: x.PID, Process: x.Process,
			Text: x.Text, Line: r.Message, Source: "kmsg", Seq: r.Seq, Action: XidAction(x.Code, x.Text)})
	})
	var health []Health
	if w.Health != nil && ctx.Err() == nil {
		h, events, herr := w.Health.Health(ctx)
		health = h
		faults = append(faults, events...)
		if err == nil {
			err = herr
		}
	}
	for i := range faults {
		placeFault(&faults[i], gpus)
	}
	return faults, health, err
}

// Close releases the kernel log and the health source.
func (w *FaultWatch) Close() error {
	if w.kmsg != nil {
		w.kmsg.Close()
	}
	if w.Health != nil {
		return w.Health.Close()
	}
	return nil
}

// placeFault gives f the index and UUID of the GPU at its bus id, or at its index when
// it has no bus id (an NVML event).
func placeFault(f *Fault, gpus []Device) {
	for _, d := range gpus {
		if f.PCIBusID != "" && d.PCIBusID == f.PCIBusID || f.PCIBusID == "" && f.UUID != "" && d.UUID == f.UUID {
			f.GPU, f.UUID, f.PCIBusID = d.Index, d.UUID, d.PCIBusID
			return
		}
	}
	f.GPU = -1
}

func rootOr(root string) string {
	if root == "" {
		return "/"
	}
	return root
}

// bootTime is when the host booted, from proc/stat's btime under root; zero when unknown.
func bootTime(root string) time.Time {
	data, err := os.ReadFile(filepath.Join(root, "proc", "stat"))
	if err != nil {
		return time.Time{}
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("btime ")); ok {
			if s, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}
