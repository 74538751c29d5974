package gpu

import "fmt"

// State is what an observation found, as one of a few distinct verdicts.
// The zero value, StateUnknown, means nothing was observed.
type State int

// The states an Observer reports. Everything but StateOK and StateNoGPU means
// the GPUs cannot be used as they are; Message says what to do about it.
const (
	StateUnknown         State = iota // not observed
	StateOK                           // driver loaded, GPUs visible
	StateNoLibrary                    // libnvidia-ml.so.1 not found
	StateNoDriver                     // the nvidia kernel module is not loaded
	StateNoGPU                        // the driver works but sees no GPU
	StateNoPermission                 // NVML or the driver files refuse this user
	StateVersionMismatch              // kernel module and userspace library differ
	StateError                        // anything else
)

var stateNames = [...]string{
	StateUnknown:         "unknown",
	StateOK:              "ok",
	StateNoLibrary:       "no-library",
	StateNoDriver:        "no-driver",
	StateNoGPU:           "no-gpu",
	StateNoPermission:    "no-permission",
	StateVersionMismatch: "version-mismatch",
	StateError:           "error",
}

var stateMessages = [...]string{
	StateUnknown:         "the GPUs have not been observed yet",
	StateOK:              "the NVIDIA driver is loaded and sees the GPUs",
	StateNoLibrary:       "libnvidia-ml.so.1 not found: install the NVIDIA driver's userspace libraries, the same version as the kernel module",
	StateNoDriver:        "the nvidia kernel module is not loaded: install the driver, or load it with modprobe nvidia (and check that nouveau is blacklisted)",
	StateNoGPU:           "the driver is loaded but sees no GPU: check lspci, that no GPU is bound to vfio-pci or excluded, and the kernel log for Xid errors",
	StateNoPermission:    "no permission to use the GPUs: run the agent as root or give it access to /dev/nvidia*",
	StateVersionMismatch: "the loaded kernel module differs from the userspace library: reboot, or reload the nvidia modules",
	StateError:           "the driver failed unexpectedly: see the detail and the kernel log (dmesg, Xid errors)",
}

// String returns the state's short name, such as "version-mismatch".
func (s State) String() string { return enumString(stateNames[:], int(s), "State") }

// Message returns one line for the operator: what the state means and the fix.
func (s State) Message() string {
	if s < 0 || int(s) >= len(stateMessages) {
		return fmt.Sprintf("unknown GPU state %d", int(s))
	}
	return stateMessages[s]
}

// MarshalText renders the state by its short name, for JSON status output.
func (s State) MarshalText() ([]byte, error) { return enumMarshal(stateNames[:], int(s), "state") }

// UnmarshalText parses a short name written by MarshalText.
func (s *State) UnmarshalText(text []byte) error {
	v, err := enumUnmarshal(stateNames[:], text, "state")
	if err == nil {
		*s = State(v)
	}
	return err
}

// enumString is names[v], or "Kind(v)" for a value without a name.
func enumString(names []string, v int, kind string) string {
	if v < 0 || v >= len(names) {
		return fmt.Sprintf("%s(%d)", kind, v)
	}
	return names[v]
}

// enumMarshal is names[v] as text; a value without a name is an error.
func enumMarshal(names []string, v int, kind string) ([]byte, error) {
	if v < 0 || v >= len(names) {
		return nil, fmt.Errorf("gpu: unknown %s %d", kind, v)
	}
	return []byte(names[v]), nil
}

// enumUnmarshal is the value named text.
func enumUnmarshal(names []string, text []byte, kind string) (int, error) {
	for i, name := range names {
		if name == string(text) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("gpu: unknown %s %q", kind, text)
}
