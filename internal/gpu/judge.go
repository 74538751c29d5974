package gpu

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// Judgement is what the faults seen on one GPU ask for now (docs/gpu.md, "When a GPU
// fails").
type Judgement struct {
	GPU      int
	PCIBusID string
	UUID     string
	// Standing is a judgement that holds until it is cleared: reset-gpu or reboot, set by
	// the most severe such fault (Cause). A reboot clears it (a new boot id), and so does
	// NVML reading the GPU healthy again.
	Standing Action
	Cause    *Fault
	// Actionable are the last faults that ask something of what uses the GPU (restart-app
	// or more, or the end of the process they name: EndsItsProcess), oldest first (at
	// most lastFaults): each is acted on once, by whoever used the GPU when it happened.
	Actionable []Fault
	// Last are the GPU's last faults, oldest first (at most lastFaults).
	Last []Fault
	// XidTotal counts the Xids seen on the GPU this boot, by code.
	XidTotal map[int]int
	// Health is NVML's last reading; nil when NVML did not read this GPU.
	Health *Health
}

const lastFaults = 8

// Book keeps one Judgement per GPU over the polls of a FaultWatch, for one boot: a new
// boot id forgets everything (a reboot clears every fault). Safe for concurrent use.
type Book struct {
	mu      sync.Mutex
	boot    string
	gpus    map[int]*Judgement
	unknown []Fault
	seen    map[uint64]bool
}

// Record adds one poll's faults and health, read at now during boot, and returns the
// faults it had not seen (a kernel log record is seen once, by its sequence number).
func (b *Book) Record(boot string, now time.Time, faults []Fault, health []Health) []Fault {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gpus == nil || boot != b.boot {
		b.boot, b.gpus, b.unknown, b.seen = boot, map[int]*Judgement{}, nil, map[uint64]bool{}
	}
	var fresh []Fault
	for _, f := range faults {
		if f.Seq > 0 {
			if b.seen[f.Seq] {
				continue
			}
			b.seen[f.Seq] = true
		}
		fresh = append(fresh, f)
		if f.GPU < 0 {
			b.unknown = keepLast(append(b.unknown, f))
			continue
		}
		b.add(f)
	}
	for _, h := range health {
		j := b.of(h.Index, h.PCIBusID, h.UUID)
		hc := h
		j.Health = &hc
		problems := h.Problems(now)
		if len(problems) == 0 {
			j.Standing, j.Cause = ActionIgnore, nil // seen healthy again
			continue
		}
		for _, p := range problems {
			if j.Cause == nil || j.Cause.Kind != p.Kind {
				b.add(p)
			}
		}
	}
	return fresh
}

// add files f under its GPU.
func (b *Book) add(f Fault) {
	j := b.of(f.GPU, f.PCIBusID, f.UUID)
	j.Last = keepLast(append(j.Last, f))
	if f.Kind == FaultXid {
		j.XidTotal[f.Xid]++
	}
	fc := f
	if f.Action >= ActionRestartApp || EndsItsProcess(f) {
		j.Actionable = keepLast(append(j.Actionable, f))
	}
	if f.Action >= ActionResetGPU && f.Action >= j.Standing {
		j.Standing, j.Cause = f.Action, &fc
	}
}

func (b *Book) of(gpu int, bus, uuid string) *Judgement {
	j := b.gpus[gpu]
	if j == nil {
		j = &Judgement{GPU: gpu, XidTotal: map[int]int{}}
		b.gpus[gpu] = j
	}
	if bus != "" {
		j.PCIBusID = bus
	}
	if uuid != "" {
		j.UUID = uuid
	}
	return j
}

func keepLast(fs []Fault) []Fault {
	if len(fs) > lastFaults {
		return slices.Clone(fs[len(fs)-lastFaults:])
	}
	return fs
}

// Clear forgets GPU gpu's standing judgement and the fault to act on: it was reset and is
// healthy again. Its last faults and counts stay.
func (b *Book) Clear(gpu int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if j := b.gpus[gpu]; j != nil {
		j.Standing, j.Cause, j.Actionable = ActionIgnore, nil, nil
	}
}

// Boot is the boot id the book judges.
func (b *Book) Boot() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.boot
}

// Of is GPU gpu's judgement (a copy); ok is false when nothing was seen on it.
func (b *Book) Of(gpu int) (Judgement, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	j, ok := b.gpus[gpu]
	if !ok {
		return Judgement{GPU: gpu}, false
	}
	return j.copy(), true
}

// All are the judgements of every GPU something was seen on, by index.
func (b *Book) All() []Judgement {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Judgement
	for _, j := range b.gpus {
		out = append(out, j.copy())
	}
	slices.SortFunc(out, func(x, y Judgement) int { return x.GPU - y.GPU })
	return out
}

// Unknown are the last faults on PCI bus ids the host has no GPU at: reported, never
// acted on.
func (b *Book) Unknown() []Fault {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.unknown)
}

func (j *Judgement) copy() Judgement {
	c := *j
	c.Last = slices.Clone(j.Last)
	c.Actionable = slices.Clone(j.Actionable)
	c.XidTotal = make(map[int]int, len(j.XidTotal))
	for k, v := range j.XidTotal {
		c.XidTotal[k] = v
	}
	return c
}

// Name is the GPU for people: "GPU 1 (0000:41:00.0)".
func (j Judgement) Name() string {
	if j.PCIBusID == "" {
		return fmt.Sprintf("GPU %d", j.GPU)
	}
	return fmt.Sprintf("GPU %d (%s)", j.GPU, j.PCIBusID)
}

// Explain is a fault for people in a GPU's words: "fell off the bus (Xid 79 at
// 10:04:05)", "row remapping failed (at 10:04:05)".
func Explain(f Fault) string {
	at := f.At.Local().Format("15:04:05")
	switch {
	case f.Kind == FaultXid && f.Xid == 79:
		return fmt.Sprintf("fell off the bus (Xid 79 at %s)", at)
	case f.Kind == FaultXid:
		what := "Xid " + fmt.Sprint(f.Xid)
		if x, ok := LookupXid(f.Xid); ok {
			what = x.Mnemonic
		}
		return fmt.Sprintf("raised %s (Xid %d at %s)", what, f.Xid, at)
	}
	return fmt.Sprintf("%s (at %s)", f.Text, at)
}
