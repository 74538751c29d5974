//go:build !cgo

package gpu

// Default returns the Observer the agent uses. Built without cgo there is no
// NVML, so it is ProcFS under root; Info.Source is SourceProcFS.
func Default(root string) Observer {
	return ProcFS{Root: root}
}

// DefaultHealth is nil built without cgo: the fault watch reads the kernel log only.
func DefaultHealth() HealthSource { return nil }
