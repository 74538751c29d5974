package gpu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkXidBurst: the kernel log grows by 1,000 Xid lines (a burst, as a failing GPU
// writes them) between two polls of the watch; one op is the poll that reads and maps
// them. cpu-s/burst is the process's user+system CPU per op (getrusage), which
// bench/xid-burst.sh compares with the 0.2 core the issue allows.
func BenchmarkXidBurst(b *testing.B) {
	root := b.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		b.Fatal(err)
	}
	kmsg := filepath.Join(root, "dev", "kmsg")
	var burst strings.Builder
	for i := range 1000 {
		burst.WriteString("4,")
		burst.WriteString(formatSeq(uint64(i)))
		burst.WriteString(",245000000,-;NVRM: Xid (PCI:0000:41:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x504648=0x80000000\n")
	}
	w := &FaultWatch{Root: root}
	defer w.Close()
	ctx := context.Background()
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		f, err := os.OpenFile(kmsg, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		f.WriteString(burst.String())
		f.Close()
		before := rusage()
		b.StartTimer()
		faults, _, err := w.Poll(ctx, twoGPUs)
		b.StopTimer()
		cpu += rusage() - before
		if err != nil || len(faults) != 1000 {
			b.Fatalf("%d faults, %v", len(faults), err)
		}
		b.StartTimer()
	}
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/burst")
}

func formatSeq(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for ; n > 0; n /= 10 {
		i--
		b[i] = byte('0' + n%10)
	}
	return string(b[i:])
}

func rusage() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
