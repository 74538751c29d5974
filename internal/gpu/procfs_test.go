package gpu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestProcFSObserve(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tree       string
		want       Info
		wantDetail string // a regexp StateDetail must match; Info.StateDetail is compared through it
	}{
		{
			tree: "a6000x2",
			want: Info{State: StateOK, DriverVersion: "580.95.05", Source: SourceProcFS, GPUs: []Device{
				{Index: 0, Name: "NVIDIA RTX A6000", UUID: "GPU-6a2e5a62-1f1c-5c3e-9f0a-2d7b8e4c1a01", PCIBusID: "0000:01:00.0"},
				{Index: 1, Name: "NVIDIA RTX A6000", UUID: "GPU-0b9d3c4e-77aa-4f21-8d3e-5c6a7b8c9d02", PCIBusID: "0000:c1:00.0"},
			}},
			wantDetail: `without NVML: memory and processes are not visible$`,
		},
		{
			tree: "h200-open",
			want: Info{State: StateOK, DriverVersion: "580.95.05", Source: SourceProcFS, GPUs: []Device{
				{Index: 0, Name: "NVIDIA H200", UUID: "GPU-3f0c6f5e-8a2b-4c1d-9e7f-1a2b3c4d5e01", PCIBusID: "0000:18:00.0"},
				{Index: 1, Name: "NVIDIA H200", UUID: "", PCIBusID: "0000:2a:00.0"}, // UUID printed as ????
			}},
			wantDetail: `without NVML`,
		},
		{
			tree:       "no-driver",
			want:       Info{State: StateNoDriver, Source: SourceProcFS},
			wantDetail: `proc/driver/nvidia/version: the nvidia kernel module is not loaded$`,
		},
		{
			tree:       "no-gpu",
			want:       Info{State: StateNoGPU, DriverVersion: "570.172.08", Source: SourceProcFS},
			wantDetail: `module 570\.172\.08 is loaded but .*gpus lists no GPU$`,
		},
		{
			tree:       "sys-only",
			want:       Info{State: StateError, DriverVersion: "580.95.05", Source: SourceProcFS},
			wantDetail: `sys/module/nvidia/version\) but .*proc/driver/nvidia is not visible$`,
		},
		{
			tree:       "garbled-version",
			want:       Info{State: StateError, Source: SourceProcFS},
			wantDetail: `no "NVRM version:" line`,
		},
	} {
		t.Run(tc.tree, func(t *testing.T) {
			t.Parallel()
			got, err := ProcFS{Root: rootFS(t, tc.tree)}.Observe(context.Background())
			if err != nil {
				t.Fatalf("Observe: %v", err)
			}
			if !regexp.MustCompile(tc.wantDetail).MatchString(got.StateDetail) {
				t.Errorf("StateDetail = %q, want a match for %q", got.StateDetail, tc.wantDetail)
			}
			got.StateDetail = ""
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Observe (-want +got):\n%s", diff)
			}
		})
	}
}

// An empty Root means the host's own "/": the paths are absolute.
func TestProcFSEmptyRootIsSlash(t *testing.T) {
	t.Parallel()
	if got := (ProcFS{}).path("proc/driver/nvidia/version"); got != "/proc/driver/nvidia/version" {
		t.Errorf("path = %q", got)
	}
}

func TestProcFSCancelledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := ProcFS{Root: rootFS(t, "a6000x2")}.Observe(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Observe with a cancelled context: err = %v, want context.Canceled", err)
	}
}

// An unreadable version file is "no permission", a state, not an error.
func TestProcFSNoPermission(t *testing.T) {
	if root := os.Getenv("GPU_TEST_NOPERM_ROOT"); root != "" {
		// The unprivileged child started below: the version file is unreadable to it.
		got, err := ProcFS{Root: root}.Observe(context.Background())
		if err != nil || got.State != StateNoPermission {
			t.Errorf("Observe = %v (%s), %v; want no-permission, nil", got.State, got.StateDetail, err)
		}
		return
	}
	t.Parallel()
	root := rootFS(t, "a6000x2")
	if err := os.Chmod(filepath.Join(root, "proc/driver/nvidia/version"), 0); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		got, err := ProcFS{Root: root}.Observe(context.Background())
		if err != nil || got.State != StateNoPermission {
			t.Errorf("Observe = %v (%s), %v; want no-permission, nil", got.State, got.StateDetail, err)
		}
		return
	}
	// Root reads files whatever their mode, and the agent runs as root: the state is
	// proven in a copy of this test binary run as nobody, which CI (root) can do.
	for d := root; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // the test's own temp directories, so nobody can reach the tree
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "gpu.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestProcFSNoPermission$", "-test.v")
	cmd.Env = append(os.Environ(), "GPU_TEST_NOPERM_ROOT="+root)
	cmd.Dir = root
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestProcFSNoPermission") {
		t.Errorf("as nobody: %v\n%s", err, out)
	}
}

// A version file that is a directory cannot be read: an error state.
func TestProcFSUnreadableVersion(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc/driver/nvidia/version"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := ProcFS{Root: root}.Observe(context.Background())
	if err != nil || got.State != StateError || !strings.Contains(got.StateDetail, "version") {
		t.Errorf("Observe = %v (%s), %v; want error state naming the file, nil", got.State, got.StateDetail, err)
	}
}

func TestParseVersionFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		want    KernelModule
		wantErr string
	}{
		{
			name: "proprietary x86_64",
			in: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n" +
				"GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
			want: KernelModule{Version: "580.95.05", Arch: "x86_64"},
		},
		{
			name: "open x86_64",
			in: "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:15:12 UTC 2025\n" +
				"GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n",
			want: KernelModule{Version: "580.95.05", Open: true, Arch: "x86_64"},
		},
		{
			name: "open aarch64",
			in:   "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build  (dvs-builder@U16-I3-C07-3-1)  Wed Jan 22 00:44:13 UTC 2025\n",
			want: KernelModule{Version: "570.86.15", Open: true, Arch: "aarch64"},
		},
		{
			name: "proprietary aarch64",
			in:   "NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15  Tue Mar  5 22:15:33 UTC 2024\n",
			want: KernelModule{Version: "550.54.15", Arch: "aarch64"},
		},
		{
			name: "legacy two-part version",
			in:   "NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022\n",
			want: KernelModule{Version: "390.157", Arch: "x86_64"},
		},
		{
			name: "leading blank line and CRLF",
			in:   "\r\nNVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Mon Aug  4 17:46:57 UTC 2025\r\n",
			want: KernelModule{Version: "535.261.03", Arch: "x86_64"},
		},
		{
			name: "no arch",
			in:   "NVRM version: NVIDIA UNIX Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n",
			want: KernelModule{Version: "580.95.05"},
		},
		{
			name: "unknown layout: first version-like field",
			in:   "NVRM version: something new 600.10.01 built today\n",
			want: KernelModule{Version: "600.10.01"},
		},
		{
			name:    "no NVRM line",
			in:      "GCC version:  gcc version 13.3.0\n",
			wantErr: `no "NVRM version:" line`,
		},
		{
			name:    "no version on the NVRM line",
			in:      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  Tue Sep 23 09:55:41 UTC 2025\n",
			wantErr: "no version in",
		},
		{name: "empty", in: "", wantErr: "no \"NVRM version:\" line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseVersionFile([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseVersionFile: err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseVersionFile: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseVersionFile (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzParseVersionFile: the parser never panics, and a version it returns
// is version-shaped and really in the input. Seeds: f.Add below and
// testdata/fuzz/FuzzParseVersionFile.
func FuzzParseVersionFile(f *testing.F) {
	f.Add([]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n"))
	f.Add([]byte("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22-I3-AF03-09-1)\n"))
	f.Add([]byte("NVRM version: NVIDIA UNIX Open Kernel Module for"))
	f.Add([]byte("NVRM version:"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseVersionFile(data)
		if err != nil {
			if m != (KernelModule{}) {
				t.Errorf("error %v with a non-zero result %+v", err, m)
			}
			return
		}
		if !versionRE.MatchString(m.Version) {
			t.Errorf("version %q is not version-shaped", m.Version)
		}
		if !strings.Contains(string(data), m.Version) {
			t.Errorf("version %q is not in the input", m.Version)
		}
		if m.Open && !strings.Contains(string(data), "Open") {
			t.Error("Open without \"Open\" in the input")
		}
		if m.Arch != "" && !strings.Contains(string(data), m.Arch) {
			t.Errorf("arch %q is not in the input", m.Arch)
		}
	})
}
