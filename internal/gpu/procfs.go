package gpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// ProcFS observes the driver through the files the nvidia kernel module
// publishes, under Root ("" means "/"):
//
//	proc/driver/nvidia/version              the loaded module's version
//	sys/module/nvidia/version               the same, when /proc/driver/nvidia is hidden
//	proc/driver/nvidia/gpus/*/information   model, UUID and bus location per GPU
//
// It needs neither cgo nor NVML, and cannot see memory, persistence mode,
// processes or the CUDA version: its Info has Source SourceProcFS and leaves
// those empty.
type ProcFS struct {
	Root string
}

var _ Observer = ProcFS{}

func (p ProcFS) path(rel string) string {
	root := p.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, filepath.FromSlash(rel))
}

// Observe implements Observer.
func (p ProcFS) Observe(ctx context.Context) (Info, error) {
	if err := ctx.Err(); err != nil {
		return Info{}, fmt.Errorf("gpu: procfs: %w", err)
	}
	info := Info{Source: SourceProcFS}
	fromSys := false

	data, err := os.ReadFile(p.path("proc/driver/nvidia/version"))
	switch {
	case err == nil:
		m, err := ParseVersionFile(data)
		if err != nil {
			info.State, info.StateDetail = StateError, err.Error()
			return info, nil
		}
		info.DriverVersion = m.Version
	case errors.Is(err, fs.ErrNotExist):
		v, serr := os.ReadFile(p.path("sys/module/nvidia/version"))
		switch {
		case serr == nil && versionRE.Match(bytes.TrimSpace(v)):
			info.DriverVersion, fromSys = string(bytes.TrimSpace(v)), true
		case serr == nil:
			info.State = StateError
			info.StateDetail = fmt.Sprintf("no version in %s: %q", p.path("sys/module/nvidia/version"), bytes.TrimSpace(v))
			return info, nil
		case errors.Is(serr, fs.ErrNotExist):
			info.State = StateNoDriver
			info.StateDetail = "no " + p.path("proc/driver/nvidia/version") + ": the nvidia kernel module is not loaded"
			return info, nil
		default:
			return stateFromFileError(info, serr), nil
		}
	default:
		return stateFromFileError(info, err), nil
	}

	files, err := filepath.Glob(p.path("proc/driver/nvidia/gpus/*/information"))
	if err != nil {
		return Info{}, fmt.Errorf("gpu: procfs: %w", err) // only a malformed pattern, i.e. a bad Root
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return stateFromFileError(info, err), nil
		}
		info.GPUs = append(info.GPUs, parseInformation(data, filepath.Base(filepath.Dir(f))))
	}
	slices.SortFunc(info.GPUs, func(a, b Device) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	for i := range info.GPUs {
		info.GPUs[i].Index = i
	}

	switch {
	case len(info.GPUs) > 0:
		info.State = StateOK
		info.StateDetail = "read from " + p.path("proc/driver/nvidia") + " without NVML: memory and processes are not visible"
	case fromSys:
		info.State = StateError
		info.StateDetail = "the nvidia module " + info.DriverVersion + " is loaded (" + p.path("sys/module/nvidia/version") +
			") but " + p.path("proc/driver/nvidia") + " is not visible"
	default:
		info.State = StateNoGPU
		info.StateDetail = "the nvidia module " + info.DriverVersion + " is loaded but " + p.path("proc/driver/nvidia/gpus") + " lists no GPU"
	}
	return info, nil
}

func stateFromFileError(info Info, err error) Info {
	info.State = StateError
	if errors.Is(err, fs.ErrPermission) {
		info.State = StateNoPermission
	}
	info.StateDetail = err.Error()
	return info
}

// parseInformation reads one proc/driver/nvidia/gpus/<bus id>/information
// file. dir, the directory's name, stands in for a missing Bus Location.
func parseInformation(data []byte, dir string) Device {
	d := Device{PCIBusID: NormalizePCIBusID(dir)}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch strings.TrimSpace(key) {
		case "Model":
			d.Name = value
		case "GPU UUID":
			// Until the GPU is initialised the driver prints GPU-????????-….
			if !strings.Contains(value, "?") {
				d.UUID = value
			}
		case "Bus Location":
			d.PCIBusID = NormalizePCIBusID(value)
		}
	}
	return d
}

// KernelModule is what the first line of /proc/driver/nvidia/version says
// about the loaded nvidia kernel module.
type KernelModule struct {
	Version string // "580.95.05"
	Open    bool   // the open GPU kernel module, not the proprietary one
	Arch    string // "x86_64", "aarch64"; empty when the line does not say
}

var versionRE = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,3}$`)

// ParseVersionFile parses /proc/driver/nvidia/version, whose first line is
// one of
//
//	NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025
//	NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 …
func ParseVersionFile(data []byte) (KernelModule, error) {
	const prefix = "NVRM version:"
	for line := range strings.Lines(string(data)) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		var m KernelModule
		start := 0
		for i, f := range fields {
			switch {
			case f == "Open":
				m.Open = true
			case f == "UNIX" && i+1 < len(fields) && fields[i+1] != "Open" && fields[i+1] != "Kernel" && m.Arch == "":
				m.Arch = fields[i+1]
			}
			if f == "Module" {
				start = i + 1
				break
			}
		}
		if start > 0 && start+1 < len(fields) && fields[start] == "for" {
			m.Arch = fields[start+1]
			start += 2
		}
		if start == 0 {
			m = KernelModule{} // not the known layout: take the first version-like field
		}
		for _, f := range fields[start:] {
			if versionRE.MatchString(f) {
				m.Version = f
				return m, nil
			}
		}
		return KernelModule{}, fmt.Errorf("gpu: no version in %q", strings.TrimSpace(line))
	}
	return KernelModule{}, fmt.Errorf("gpu: no %q line in the nvidia version file", prefix)
}
