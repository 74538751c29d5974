package gpu

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// xidCorpus reads testdata/xid/lines.txt: each line with what it must parse to.
func xidCorpus(t testing.TB) (lines []string, wants []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "xid", "lines.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(string(data), "\n") {
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "=> "):
			lines, wants = append(lines, line), append(wants, strings.TrimPrefix(l, "=> "))
		default:
			line = l
		}
	}
	if len(lines) < 15 {
		t.Fatalf("corpus has %d cases", len(lines))
	}
	return lines, wants
}

// Every line of the corpus (the driver's formats, real lines with their links) parses
// to what it says; the lines around an Xid that are not one do not.
func TestXidLinesCorpus(t *testing.T) {
	lines, wants := xidCorpus(t)
	for i, line := range lines {
		x, ok := ParseXidLine(line)
		got := "none"
		if ok {
			got = strings.Join([]string{x.PCIBusID, strconv.Itoa(x.Code), strconv.Itoa(x.PID), x.Process, x.Text}, "\t")
		}
		if got != wants[i] {
			t.Errorf("ParseXidLine(%q)\n got %q\nwant %q", line, got, wants[i])
		}
	}
}

func TestXidLineMIG(t *testing.T) {
	x, ok := ParseXidLine("NVRM: Xid (PCI:0000:41:00 GPU-I:01 GPU-CI:02): 13, pid=4242, name=python3, Graphics Exception")
	if !ok || x.GPUInstance != 1 || x.ComputeInstance != 2 {
		t.Fatalf("got %+v, %v; want GPU-I 1, GPU-CI 2", x, ok)
	}
	x, _ = ParseXidLine("NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus.")
	if x.GPUInstance != -1 || x.ComputeInstance != -1 {
		t.Errorf("no MIG attribution should read -1, -1: %+v", x)
	}
	for _, bad := range []string{
		"NVRM: Xid (PCI:0000:41:00 GPU-X:01): 13, text",
		"NVRM: Xid (PCI:zz:41:00): 13, text",
		"NVRM: Xid (PCI:0000:41:00): , text",
		"NVRM: Xid (PCI:0000:41:00): 1234567, text",
		"NVRM: Xid (PCI:0000:41:00) 13, text",
		"NVRM: Xid (PCI:0000:41): 13, text",
	} {
		if x, ok := ParseXidLine(bad); ok {
			t.Errorf("ParseXidLine(%q) = %+v, want no Xid", bad, x)
		}
	}
}

// The table is NVIDIA's catalog: the rows the issue and the docs name, each with the
// bucket the catalog gives it, and every row well formed.
func TestXidCatalog(t *testing.T) {
	for _, tc := range []struct {
		code      int
		mnemonic  string
		immediate string
		action    Action
	}{
		{13, "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", ActionRestartApp},
		{31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP", ActionRestartApp},
		{43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE", ActionIgnore},
		{45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45", ActionIgnore},
		{48, "ROBUST_CHANNEL_GPU_ECC_DBE", "WORKFLOW_XID_48", ActionResetGPU},
		{63, "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", ActionIgnore},
		{64, "INFOROM_DRAM_RETIREMENT_FAILURE", "RESET_GPU", ActionResetGPU},
		{74, "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR", ActionContactSupport},
		{79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", ActionReboot},
		{94, "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP", ActionRestartApp},
		{95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU", ActionResetGPU},
		{119, "GSP_RPC_TIMEOUT", "RESET_GPU", ActionResetGPU},
		{142, "ROBUST_CHANNEL_NVENC3_ERROR", "CONTACT_SUPPORT", ActionContactSupport},
		{151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "RESTART_VM", ActionReboot},
	} {
		x, ok := LookupXid(tc.code)
		if !ok || x.Mnemonic != tc.mnemonic || x.Immediate != tc.immediate || x.Action != tc.action {
			t.Errorf("Xid %d: got %+v (listed %v), want %s %s → %s", tc.code, x, ok, tc.mnemonic, tc.immediate, tc.action)
		}
	}
	known := map[string]bool{"A100": true, "H100": true, "B100": true, "GB200": true}
	prev := 0
	for _, code := range slices.Sorted(mapsKeys(xidCatalog)) {
		x := xidCatalog[code]
		if code <= prev || x.Code != code || x.Mnemonic == "" || len(x.AppliesTo) == 0 {
			t.Errorf("Xid %d: malformed row %+v", code, x)
		}
		for _, g := range x.AppliesTo {
			if !known[g] {
				t.Errorf("Xid %d applies to %q, not a GPU of the catalog", code, g)
			}
		}
		prev = code
	}
	// Codes the catalog marks unused on every GPU, or gives no action, are not in the table:
	// reported, never acted on.
	for _, code := range []int{1, 9, 42, 165, 999} {
		if _, ok := LookupXid(code); ok {
			t.Errorf("Xid %d should not be listed", code)
		}
		if a := XidAction(code, ""); a != ActionContactSupport {
			t.Errorf("XidAction(%d) = %s, want contact-support", code, a)
		}
	}
	if _, err := parseCatalog("79\tX\tREBOOT_NOW\t-\tA100\n"); err == nil {
		t.Error("a bucket the agent does not know must fail the table's load")
	}
}

func mapsKeys(m map[int]XidInfo) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Xid 154's action is the one its text names.
func TestXid154Action(t *testing.T) {
	for text, want := range map[string]Action{
		"GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)": ActionReboot,
		"GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)":            ActionReboot,
		"GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)":   ActionResetGPU,
		"GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)":      ActionResetGPU,
		"GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)":            ActionRestartApp,
		"GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)":   ActionIgnore,
		"something else": ActionContactSupport,
	} {
		if got := XidAction(154, text); got != want {
			t.Errorf("XidAction(154, %q) = %s, want %s", text, got, want)
		}
	}
}

func TestActionText(t *testing.T) {
	for a := ActionIgnore; a <= ActionReboot; a++ {
		b, err := a.MarshalText()
		var back Action
		if err != nil || back.UnmarshalText(b) != nil || back != a {
			t.Errorf("%d: %q %v → %d", a, b, err, back)
		}
	}
	if _, err := Action(9).MarshalText(); err == nil {
		t.Error("Action(9) marshalled")
	}
}

func TestParseKmsgRecord(t *testing.T) {
	for line, want := range map[string]KmsgRecord{
		"4,1234,5678901234,-;NVRM: Xid (PCI:0000:01:00): 43, pid=5678, name=python3, Ch 00000010": {Seq: 1234, Usec: 5678901234, Message: "NVRM: Xid (PCI:0000:01:00): 43, pid=5678, name=python3, Ch 00000010"},
		"6,339,5140900,-,caller=T1;NET: Registered protocol family 10":                            {Seq: 339, Usec: 5140900, Message: "NET: Registered protocol family 10"},
		"[ 1936.510073] NVRM: Xid (PCI:0000:23:00): 79, GPU has fallen off the bus.":              {Message: "[ 1936.510073] NVRM: Xid (PCI:0000:23:00): 79, GPU has fallen off the bus."},
		"x,1,2,-;text": {Message: "x,1,2,-;text"},
	} {
		got, ok := ParseKmsgRecord(line)
		if !ok || got != want {
			t.Errorf("ParseKmsgRecord(%q) = %+v, %v; want %+v", line, got, ok, want)
		}
	}
	if _, ok := ParseKmsgRecord(" SUBSYSTEM=pci"); ok {
		t.Error("a continuation line is not a record")
	}
}

// FuzzParseXidLine: no input panics, and an Xid read back from what it parsed is the
// same Xid.
func FuzzParseXidLine(f *testing.F) {
	lines, _ := xidCorpus(f)
	for _, l := range lines {
		f.Add(l)
		f.Add("4,99,123,-;" + l)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, _ := ParseKmsgRecord(s)
		x, ok := ParseXidLine(r.Message)
		if !ok {
			return
		}
		if x.Code < 0 || x.Code > 999999 || x.PCIBusID == "" {
			t.Fatalf("%q parsed to %+v", s, x)
		}
		_ = XidAction(x.Code, x.Text)
	})
}

// Only Xid 43 naming a process ends that process among the faults that ask nothing of
// the GPU.
func TestEndsItsProcess(t *testing.T) {
	for f, want := range map[Fault]bool{
		{Kind: FaultXid, Xid: 43, PID: 7}: true,
		{Kind: FaultXid, Xid: 43}:         false,
		{Kind: FaultXid, Xid: 63, PID: 7}: false,
		{Kind: FaultXid, Xid: 74, PID: 7}: false,
	} {
		if got := EndsItsProcess(f); got != want {
			t.Errorf("EndsItsProcess(%+v) = %v", f, got)
		}
	}
}
