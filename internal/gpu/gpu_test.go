package gpu

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestNormalizePCIBusID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"00000000:01:00.0", "0000:01:00.0"}, // NVML: 8-digit domain
		{"00000000:1B:00.0", "0000:1b:00.0"}, // NVML: upper case
		{"0000:C1:00.0", "0000:c1:00.0"},
		{"0000:01:00.0", "0000:01:00.0"}, // already normal
		{"01:00.0", "0000:01:00.0"},      // lspci without domain
		{"00010000:3a:00.1", "10000:3a:00.1"},
		{" 0000:2a:00.0\n", "0000:2a:00.0"},
		{"00000000:18:00.0\x00\x00", "0000:18:00.0"},
		{"", ""},
		{"not-a-bus-id", "not-a-bus-id"},
		{"0000:zz:00.0", "0000:zz:00.0"},
		{"0000:01:20.0", "0000:01:20.0"}, // device > 0x1f: not PCI, left alone
		{"0000:01:00.8", "0000:01:00.8"}, // function > 7
		{"0000:01:00", "0000:01:00"},
	} {
		if got := NormalizePCIBusID(tc.in); got != tc.want {
			t.Errorf("NormalizePCIBusID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestProcessesUsing(t *testing.T) {
	t.Parallel()
	info := Info{State: StateOK, Source: SourceNVML, GPUs: []Device{
		{Index: 0, Processes: []Process{{PID: 4242, UsedMemory: 70 << 30}, {PID: 77, UsedMemory: 1 << 20}}},
		{Index: 1, Processes: []Process{{PID: 4243, UsedMemory: 3 << 29}, {PID: 4242, UsedMemory: 1 << 30}}},
		{Index: 2},
	}}
	for _, tc := range []struct {
		name string
		pids []int
		want []Process
	}{
		{"none asked", nil, nil},
		{"none present", []int{1, 2}, nil},
		{"one", []int{4243}, []Process{{PID: 4243, UsedMemory: 3 << 29}}},
		{"summed over GPUs, sorted, others ignored", []int{4243, 4242, 9}, []Process{
			{PID: 4242, UsedMemory: 71 << 30},
			{PID: 4243, UsedMemory: 3 << 29},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, ProcessesUsing(info, tc.pids)); diff != "" {
				t.Errorf("ProcessesUsing(%v) (-want +got):\n%s", tc.pids, diff)
			}
		})
	}
}
