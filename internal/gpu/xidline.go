package gpu

import (
	"strconv"
	"strings"
)

// XidLine is one Xid line of the kernel log, as the NVIDIA driver prints it. The driver's
// formats (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c,
// krcReportXidOnGpu; corpus and links in testdata/xid/lines.txt):
//
//	NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, %s
//	NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u): %d, pid=%s, name=%s, %s
//	NVRM: Xid (PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u): %d, pid=%s, name=%s, %s
//
// where pid is a number or '<unknown>' and name a process name or <unknown>. Older drivers
// print "pid=%d, %s" without a name, or only "%d, %s", and the oldest "Xid (0000:03:00)"
// without "PCI:". The device is named without its PCI function.
type XidLine struct {
	PCIBusID string // normalised, with function 0: "0000:01:00.0"
	Code     int
	PID      int    // 0 when the driver did not know it
	Process  string // the process name; "" when unknown
	Text     string // what follows the pid and name: "GPU has fallen off the bus."
	// GPUInstance and ComputeInstance are the MIG instances the driver attributed the Xid
	// to; -1 when it attributed none.
	GPUInstance, ComputeInstance int
}

const xidMarker = "NVRM: Xid ("

// ParseXidLine finds an Xid in one kernel log message (a /dev/kmsg record's text, a
// dmesg or journal line: anything before "NVRM: Xid (" is ignored). ok is false when the
// message holds no Xid in a form the driver prints.
func ParseXidLine(msg string) (x XidLine, ok bool) {
	i := strings.Index(msg, xidMarker)
	if i < 0 {
		return x, false
	}
	rest := msg[i+len(xidMarker):]
	end := strings.IndexByte(rest, ')')
	if end < 0 {
		return x, false
	}
	dev, rest := rest[:end], rest[end+1:]
	if !strings.HasPrefix(rest, ": ") {
		return x, false
	}
	rest = rest[2:]
	if x, ok = parseXidDevice(dev); !ok {
		return x, false
	}
	n := 0
	for n < len(rest) && n < 6 && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		return x, false
	}
	x.Code, _ = strconv.Atoi(rest[:n])
	rest = rest[n:]
	switch {
	case rest == "":
	case strings.HasPrefix(rest, ", "):
		rest = rest[2:]
	default:
		return x, false
	}
	if v, after, found := field(rest, "pid="); found {
		x.PID, _ = strconv.Atoi(v)
		rest = after
		if v, after, found := field(rest, "name="); found {
			if v != "<unknown>" {
				x.Process = v
			}
			rest = after
		}
	}
	x.Text = strings.TrimRight(rest, "\r\n")
	return x, true
}

// field reads "key=VALUE, " at the start of s: VALUE and what follows the comma.
func field(s, key string) (value, after string, ok bool) {
	if !strings.HasPrefix(s, key) {
		return "", s, false
	}
	s = s[len(key):]
	if j := strings.Index(s, ", "); j >= 0 {
		return s[:j], s[j+2:], true
	}
	return strings.TrimRight(s, "\r\n"), "", true
}

// parseXidDevice reads "PCI:0000:01:00", "PCI:0000:01:00 GPU-I:01 GPU-CI:02" or "0000:03:00".
func parseXidDevice(dev string) (x XidLine, ok bool) {
	x.GPUInstance, x.ComputeInstance = -1, -1
	dev = strings.TrimPrefix(dev, "PCI:")
	parts := strings.Fields(dev)
	if len(parts) == 0 || len(parts) > 3 {
		return x, false
	}
	bdf := parts[0]
	if strings.Count(bdf, ":") == 2 && !strings.Contains(bdf, ".") {
		bdf += ".0"
	}
	if x.PCIBusID, ok = parsePCIBusID(bdf); !ok || strings.Count(parts[0], ":") != 2 {
		return x, false
	}
	for _, p := range parts[1:] {
		k, v, found := strings.Cut(p, ":")
		n, err := strconv.Atoi(v)
		if !found || err != nil || n < 0 {
			return x, false
		}
		switch k {
		case "GPU-I":
			x.GPUInstance = n
		case "GPU-CI":
			x.ComputeInstance = n
		default:
			return x, false
		}
	}
	return x, true
}

// KmsgRecord is one /dev/kmsg record: "PRIO,SEQ,TS_USEC,FLAGS[,…];MESSAGE" (the kernel's
// Documentation/ABI/testing/dev-kmsg), followed by continuation lines " KEY=VALUE" that
// this reader skips.
type KmsgRecord struct {
	Seq     uint64
	Usec    uint64 // microseconds since boot, by the kernel's clock
	Message string
}

// ParseKmsgRecord reads one record line. A line without the header (a plain dmesg or
// journal line in a file standing for the kernel log) is returned whole as the message
// with Seq 0; a continuation line is not a record.
func ParseKmsgRecord(line string) (r KmsgRecord, ok bool) {
	if line == "" || line[0] == ' ' {
		return r, false
	}
	head, msg, found := strings.Cut(line, ";")
	if !found {
		return KmsgRecord{Message: line}, true
	}
	f := strings.SplitN(head, ",", 5)
	if len(f) < 4 {
		return KmsgRecord{Message: line}, true
	}
	if _, err := strconv.ParseUint(f[0], 10, 32); err != nil {
		return KmsgRecord{Message: line}, true
	}
	seq, err1 := strconv.ParseUint(f[1], 10, 64)
	usec, err2 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return KmsgRecord{Message: line}, true
	}
	return KmsgRecord{Seq: seq, Usec: usec, Message: msg}, true
}
