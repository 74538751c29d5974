package gpu

import (
	"testing"
	"time"
)

// The book keeps one judgement per GPU: restart-app faults are the latest to act on, a
// reboot-class fault stands until a new boot, NVML reading the GPU healthy clears a
// standing reset, a record is counted once, and a fault on an unknown bus id is only
// kept as unknown.
func TestBookJudges(t *testing.T) {
	at := time.Date(2026, 12, 5, 10, 4, 5, 0, time.Local)
	x43 := Fault{At: at, GPU: 0, PCIBusID: "0000:01:00.0", Kind: FaultXid, Xid: 43, PID: 77, Seq: 1, Action: ActionIgnore}
	x74 := Fault{At: at, GPU: 0, PCIBusID: "0000:01:00.0", Kind: FaultXid, Xid: 74, PID: 77, Seq: 4, Action: ActionContactSupport}
	x79 := Fault{At: at, GPU: 1, PCIBusID: "0000:41:00.0", Kind: FaultXid, Xid: 79, Seq: 2, Action: ActionReboot}
	xNo := Fault{At: at, GPU: -1, PCIBusID: "0000:c1:00.0", Kind: FaultXid, Xid: 79, Seq: 3, Action: ActionReboot}
	var b Book
	fresh := b.Record("boot-a", at, []Fault{x43, x79, xNo, x74}, nil)
	if len(fresh) != 4 {
		t.Fatalf("fresh %d", len(fresh))
	}
	if fresh := b.Record("boot-a", at, []Fault{x43, x79}, nil); len(fresh) != 0 {
		t.Errorf("the same records twice: %+v", fresh)
	}
	j0, _ := b.Of(0)
	if j0.Standing != ActionIgnore || len(j0.Actionable) != 1 || j0.Actionable[0].Xid != 43 || j0.XidTotal[43] != 1 {
		t.Errorf("GPU 0: %+v", j0)
	}
	j1, _ := b.Of(1)
	if j1.Standing != ActionReboot || j1.Cause.Xid != 79 {
		t.Errorf("GPU 1: %+v", j1)
	}
	if got := j1.Name() + " " + Explain(*j1.Cause); got != "GPU 1 (0000:41:00.0) fell off the bus (Xid 79 at 10:04:05)" {
		t.Errorf("explained %q", got)
	}
	if _, ok := b.Of(2); ok || len(b.Unknown()) != 1 || len(b.All()) != 2 {
		t.Errorf("the unknown bus id must act on no GPU: %+v %+v", b.Unknown(), b.All())
	}

	// NVML reads GPU 0 with a pending remap, then healthy.
	b.Record("boot-a", at, nil, []Health{{Index: 0, PCIBusID: "0000:01:00.0", RemapKnown: true, RemapPending: true}})
	if j0, _ = b.Of(0); j0.Standing != ActionResetGPU || j0.Cause.Kind != FaultRemapPending {
		t.Errorf("pending remap: %+v", j0)
	}
	b.Record("boot-a", at, nil, []Health{{Index: 0, PCIBusID: "0000:01:00.0", RemapKnown: true}})
	if j0, _ = b.Of(0); j0.Standing != ActionIgnore || j0.Cause != nil || j0.Health == nil {
		t.Errorf("healthy again: %+v", j0)
	}

	b.Record("boot-b", at, nil, nil)
	if _, ok := b.Of(1); ok || b.Boot() != "boot-b" {
		t.Error("a reboot clears every judgement")
	}
}
