package gpu

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// faultRoot is a host root whose dev/kmsg is a regular file the test appends to, and
// whose proc/stat gives the boot time.
func faultRoot(t *testing.T, btime int64) (root string, appendLine func(string)) {
	t.Helper()
	root = t.TempDir()
	for _, d := range []string{"dev", "proc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	stat := "cpu  1 2 3 4\nbtime " + strconv.FormatInt(btime, 10) + "\nprocesses 1\n"
	if err := os.WriteFile(filepath.Join(root, "proc", "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	kmsg := filepath.Join(root, "dev", "kmsg")
	if err := os.WriteFile(kmsg, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return root, func(s string) {
		f, err := os.OpenFile(kmsg, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
}

var twoGPUs = []Device{
	{Index: 0, UUID: "GPU-aaaa", PCIBusID: "0000:01:00.0"},
	{Index: 1, UUID: "GPU-bbbb", PCIBusID: "0000:41:00.0"},
}

// The watch reads only what the kernel log grew by, whole records only, each Xid mapped
// to its GPU by PCI bus id and timed from the boot time plus the record's clock; a bus id
// the host has no GPU at keeps GPU -1; other records are not faults.
func TestFaultWatchFollowsTheKernelLog(t *testing.T) {
	const btime = 1796551200 // 2026-12-05 10:00:00 UTC
	root, write := faultRoot(t, btime)
	w := &FaultWatch{Root: root}
	defer w.Close()
	ctx := context.Background()

	write("6,100,1000000,-;NET: Registered protocol family 10\n")
	write("4,101,245000000,-;NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
	write("4,102,246000000,-;NVRM: Xid (PCI:0000:01:00): 43, pid=5678, name=python3, Ch 000")
	faults, _, err := w.Poll(ctx, twoGPUs)
	if err != nil {
		t.Fatal(err)
	}
	if len(faults) != 1 {
		t.Fatalf("got %d faults, want the one whole Xid record: %+v", len(faults), faults)
	}
	f := faults[0]
	want := Fault{At: time.Unix(btime+245, 0), PCIBusID: "0000:41:00.0", GPU: 1, UUID: "GPU-bbbb", Kind: FaultXid, Xid: 79,
		Text: "GPU has fallen off the bus.", Line: "NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
		Source: "kmsg", Seq: 101, Action: ActionReboot}
	if !f.At.Equal(want.At) {
		t.Errorf("At = %s, want %s", f.At, want.At)
	}
	f.At = want.At
	if f != want {
		t.Errorf("fault\n got %+v\nwant %+v", f, want)
	}

	write("00010\n")
	write("4,103,300000000,-;NVRM: Xid (PCI:0000:c1:00): 13, pid=1, name=x, Graphics Exception\n")
	faults, _, err = w.Poll(ctx, twoGPUs)
	if err != nil {
		t.Fatal(err)
	}
	if len(faults) != 2 || faults[0].Xid != 43 || faults[0].GPU != 0 || faults[0].PID != 5678 || faults[0].Action != ActionIgnore ||
		faults[0].Text != "Ch 00000010" || faults[1].GPU != -1 || faults[1].PCIBusID != "0000:c1:00.0" {
		t.Fatalf("second poll: %+v", faults)
	}
	if faults, _, _ = w.Poll(ctx, twoGPUs); len(faults) != 0 {
		t.Errorf("nothing new was written, got %+v", faults)
	}
}

// A log truncated (or replaced) is read again from its start; a host without dev/kmsg
// has an empty log, not an error.
func TestFaultWatchTruncatedAndMissing(t *testing.T) {
	root, write := faultRoot(t, 0)
	w := &FaultWatch{Root: root, Now: func() time.Time { return time.Unix(42, 0) }}
	defer w.Close()
	write("[ 12.5] NVRM: Xid (PCI:0000:01:00): 31, pid=7, name=a, MMU Fault\n")
	faults, _, err := w.Poll(context.Background(), twoGPUs)
	if err != nil || len(faults) != 1 || !faults[0].At.Equal(time.Unix(42, 0)) || faults[0].Seq != 0 {
		t.Fatalf("a plain line is timed when it is read: %+v %v", faults, err)
	}
	kmsg := filepath.Join(root, "dev", "kmsg")
	if err := os.WriteFile(kmsg, []byte("NVRM: Xid (PCI:0000:01:00): 48, DBE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	faults, _, err = w.Poll(context.Background(), twoGPUs)
	if err != nil || len(faults) != 1 || faults[0].Xid != 48 {
		t.Fatalf("after truncation: %+v %v", faults, err)
	}
	repl := kmsg + ".new"
	if err := os.WriteFile(repl, []byte("NVRM: Xid (PCI:0000:41:00): 79, gone\nNVRM: Xid (PCI:0000:41:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(repl, kmsg); err != nil {
		t.Fatal(err)
	}
	faults, _, err = w.Poll(context.Background(), twoGPUs)
	if err != nil || len(faults) != 2 || faults[0].Xid != 79 || faults[1].Action != ActionReboot {
		t.Fatalf("after replacement: %+v %v", faults, err)
	}

	empty := &FaultWatch{Root: t.TempDir()}
	if faults, _, err := empty.Poll(context.Background(), twoGPUs); err != nil || len(faults) != 0 {
		t.Errorf("no dev/kmsg: %+v %v", faults, err)
	}
}

// Health's problems, most severe first, and none for a healthy GPU.
func TestHealthProblems(t *testing.T) {
	at := time.Unix(1, 0)
	if p := (Health{ECCKnown: true, RemapKnown: true}).Problems(at); len(p) != 0 {
		t.Errorf("a healthy GPU has problems: %+v", p)
	}
	h := Health{Index: 1, PCIBusID: "0000:41:00.0", Lost: true, RemapFailed: true, RemapPending: true, RetiredPending: true, ResetRequired: true,
		Recovery: ActionReboot, RecoveryText: "Node Reboot Required"}
	var kinds []string
	for _, f := range h.Problems(at) {
		kinds = append(kinds, f.Kind+"/"+f.Action.String())
		if f.GPU != 1 || f.PCIBusID != "0000:41:00.0" || f.Source != "nvml" {
			t.Errorf("fault not placed: %+v", f)
		}
	}
	want := []string{"gpu-lost/reboot", "remap-failed/reboot", "recovery-action/reboot", "reset-required/reset-gpu", "remap-pending/reset-gpu", "retired-pages-pending/reset-gpu"}
	if len(kinds) != len(want) {
		t.Fatalf("got %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Errorf("problem %d: %s, want %s", i, kinds[i], want[i])
		}
	}
}

// The host's own /dev/kmsg (a character device, each read one record, EAGAIN at the end)
// is read to its end and returns: a read that blocked would hold every server's watch.
func TestKmsgFollowerReadsTheRealDeviceToItsEnd(t *testing.T) {
	if _, err := os.Stat("/dev/kmsg"); err != nil {
		t.Logf("no /dev/kmsg here: %v; the device path is not exercised", err)
		return
	}
	k := NewKmsgFollower("/dev/kmsg")
	defer k.Close()
	done := make(chan error, 1)
	n := 0
	go func() { done <- k.Read(func(KmsgRecord) { n++ }) }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, os.ErrPermission) {
			t.Fatalf("Read: %v", err)
		}
		t.Logf("%d records", n)
	case <-time.After(10 * time.Second):
		t.Fatal("reading /dev/kmsg did not return: a non-blocking read must end at EAGAIN")
	}
	second := make(chan error, 1)
	go func() { second <- k.Read(func(KmsgRecord) {}) }()
	select {
	case <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("a second read of /dev/kmsg with nothing new did not return")
	}
}
