package gpu

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"
)

// Action is what a GPU fault asks of the host, one of the resolution buckets of NVIDIA's
// Xid catalog (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html,
// "Resolution Bucket (Immediate Action)"), folded into the few the agent can act on.
// Ordered by severity: a GPU's judgement is the most severe of its faults.
type Action int

// The actions, least severe first.
const (
	ActionIgnore         Action = iota // nothing to do: the GPU recovered (IGNORE)
	ActionContactSupport               // report only: a person must look (CONTACT_SUPPORT, CHECK_MECHANICALS, UPDATE_SWFW, the workflows the agent cannot run)
	ActionRestartApp                   // relaunch what used the GPU (RESTART_APP)
	ActionResetGPU                     // stop what uses the GPU, reset it, relaunch (RESET_GPU)
	ActionReboot                       // reboot the machine (RESTART_BM, RESTART_VM)
)

var actionNames = [...]string{
	ActionIgnore:         "ignore",
	ActionContactSupport: "contact-support",
	ActionRestartApp:     "restart-app",
	ActionResetGPU:       "reset-gpu",
	ActionReboot:         "reboot",
}

// String is the action's short name, such as "reset-gpu".
func (a Action) String() string { return enumString(actionNames[:], int(a), "Action") }

// MarshalText renders the action by its short name.
func (a Action) MarshalText() ([]byte, error) { return enumMarshal(actionNames[:], int(a), "action") }

// UnmarshalText parses a short name written by MarshalText.
func (a *Action) UnmarshalText(text []byte) error {
	v, err := enumUnmarshal(actionNames[:], text, "action")
	if err == nil {
		*a = Action(v)
	}
	return err
}

// XidInfo is one row of NVIDIA's Xid catalog.
type XidInfo struct {
	Code          int
	Mnemonic      string // ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
	Immediate     string // the catalog's immediate bucket as NVIDIA spells it: RESTART_BM
	Investigatory string // the catalog's investigatory bucket; "-" when it gives none
	AppliesTo     []string
	Action        Action // Immediate, as the agent acts on it
}

//go:embed xid_catalog.tsv
var xidCatalogTSV string

// xidCatalog is xid_catalog.tsv by code, read once.
var xidCatalog = mustParseCatalog(xidCatalogTSV)

// bucketActions folds the catalog's immediate buckets into Actions. A bucket that names a
// workflow of NVIDIA's is folded into what that workflow starts with: Xid 48 (a double
// bit ECC error) alone asks for a GPU reset; Xid 45 (preemptive cleanup) follows the Xid
// it comes with, which is acted on by itself; the NVLink workflows need a person.
// XID_154 is read from the line itself (recoveryAction).
var bucketActions = map[string]Action{
	"IGNORE":               ActionIgnore,
	"WORKFLOW_XID_45":      ActionIgnore,
	"RESTART_APP":          ActionRestartApp,
	"RESET_GPU":            ActionResetGPU,
	"WORKFLOW_XID_48":      ActionResetGPU,
	"RESTART_BM":           ActionReboot,
	"RESTART_VM":           ActionReboot,
	"CONTACT_SUPPORT":      ActionContactSupport,
	"CHECK_MECHANICALS":    ActionContactSupport,
	"UPDATE_SWFW":          ActionContactSupport,
	"CHECK_UVM":            ActionContactSupport,
	"WORKFLOW_NVLINK_ERR":  ActionContactSupport,
	"WORKFLOW_NVLINK5_ERR": ActionContactSupport,
	"XID_154":              ActionIgnore,
}

func mustParseCatalog(tsv string) map[int]XidInfo {
	out, err := parseCatalog(tsv)
	if err != nil {
		panic(err)
	}
	return out
}

// parseCatalog reads the catalog's tab-separated rows; lines starting with # are comments.
func parseCatalog(tsv string) (map[int]XidInfo, error) {
	out := map[int]XidInfo{}
	for n, line := range strings.Split(tsv, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		if len(f) != 5 {
			return nil, fmt.Errorf("gpu: xid_catalog.tsv line %d: %d fields, want 5", n+1, len(f))
		}
		code, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("gpu: xid_catalog.tsv line %d: code %q", n+1, f[0])
		}
		a, ok := bucketActions[f[2]]
		if !ok {
			return nil, fmt.Errorf("gpu: xid_catalog.tsv line %d: unknown bucket %q", n+1, f[2])
		}
		if _, dup := out[code]; dup {
			return nil, fmt.Errorf("gpu: xid_catalog.tsv line %d: Xid %d twice", n+1, code)
		}
		out[code] = XidInfo{Code: code, Mnemonic: f[1], Immediate: f[2], Investigatory: f[3], AppliesTo: strings.Split(f[4], ","), Action: a}
	}
	return out, nil
}

// LookupXid is the catalog's row for code; ok is false for a code the catalog does not
// list for any current GPU (reported, never acted on).
func LookupXid(code int) (XidInfo, bool) {
	x, ok := xidCatalog[code]
	return x, ok
}

// XidAction is what the agent does for Xid code with the given text: the catalog's
// immediate action, and for Xid 154 the recovery action the driver names in its text.
// A code the catalog does not list is reported only.
func XidAction(code int, text string) Action {
	if code == 154 {
		return recoveryAction(text)
	}
	if x, ok := xidCatalog[code]; ok {
		return x.Action
	}
	return ActionContactSupport
}

// EndsItsProcess reports whether f, in a bucket that asks nothing of the GPU, is the end
// of the process it names: Xid 43, the driver resetting that process's channel (NVIDIA's
// Xid guide: "GPU stopped processing … the user application exits"). Its catalog bucket
// is IGNORE because the GPU needs nothing; the application it names does.
func EndsItsProcess(f Fault) bool {
	return f.Kind == FaultXid && f.Xid == 43 && f.PID > 0
}

// recoveryAction reads Xid 154's "GPU recovery action changed from 0x0 (None) to 0x2 (Node
// Reboot Required)": the action is the one it changed to. The catalog lists the names
// None, Drain P2P, Drain and Reset, GPU Reset Required and Node Reboot Required; drivers
// also print "OS Reboot". A text that names none of them is reported only.
func recoveryAction(text string) Action {
	i := strings.LastIndex(text, " to ")
	if i < 0 {
		return ActionContactSupport
	}
	to := strings.ToLower(text[i+4:])
	switch {
	case strings.Contains(to, "reboot"):
		return ActionReboot
	case strings.Contains(to, "reset"):
		return ActionResetGPU
	case strings.Contains(to, "drain p2p"):
		return ActionRestartApp
	case strings.Contains(to, "(none)"):
		return ActionIgnore
	}
	return ActionContactSupport
}
