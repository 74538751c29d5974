package export

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/proc"
)

// FormatVersion is the version of the JSON view (`agent export --json`): a string, the
// same as every other command's document (docs/json-output.md) so that one check of
// format_version serves them all.
const FormatVersion = "3"

// Options says where to look and what to include.
type Options struct {
	// Hostname is written into the plan's host guard; "" is os.Hostname().
	Hostname string
	// Proc reads processes; the zero value reads /proc.
	Proc proc.FS
	// GPU observes the driver; nil skips it.
	GPU gpu.Observer
	// Incus lists instances; nil skips them.
	Incus *incus.Client
	// Ports, when not empty, limits the model servers to those on these ports.
	Ports []int
	// Hash computes the sha256 of every weights file (reads every byte).
	Hash bool
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// Observation is one look at a host: what Render writes, and the JSON view.
type Observation struct {
	FormatVersion string      `json:"format_version"`
	Hostname      string      `json:"hostname"`
	ObservedAt    time.Time   `json:"observed_at"`
	Driver        *Driver     `json:"driver,omitempty"`
	Containers    []Container `json:"containers"`
	Servers       []Server    `json:"servers"`
	Weights       []Weights   `json:"weights"`
	// Notes are what export could not observe, or observed and left out, and why.
	Notes []string `json:"notes"`
}

// Driver is the loaded NVIDIA kernel module and the GPUs it drives.
type Driver struct {
	Version string   `json:"version"`
	GPUs    []string `json:"gpus"` // "0000:01:00.0 NVIDIA RTX A6000"
	Source  string   `json:"source"`
}

// Observe looks at the host. Parts that cannot be observed (no driver, no Incus socket)
// become notes, not errors; an error means the host could not be read at all.
func Observe(ctx context.Context, o Options) (*Observation, error) {
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	h := &Observation{FormatVersion: FormatVersion, Hostname: o.Hostname, ObservedAt: now().UTC(),
		Containers: []Container{}, Servers: []Server{}, Weights: []Weights{}, Notes: []string{}}
	if h.Hostname == "" {
		name, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("hostname: %w", err)
		}
		h.Hostname = name
	}
	if o.GPU != nil {
		info, err := o.GPU.Observe(ctx)
		switch {
		case err != nil:
			h.Notes = append(h.Notes, "nvidia driver: not observed: "+err.Error())
		case info.DriverVersion == "":
			h.Notes = append(h.Notes, fmt.Sprintf("nvidia driver: none loaded (%s)", info.State))
		default:
			d := &Driver{Version: info.DriverVersion, Source: info.Source, GPUs: []string{}}
			for _, g := range info.GPUs {
				d.GPUs = append(d.GPUs, gpu.NormalizePCIBusID(g.PCIBusID)+" "+g.Name)
			}
			h.Driver = d
		}
	}
	if o.Incus != nil {
		cs, notes, err := observeInstances(ctx, o.Incus)
		if err != nil {
			return nil, err
		}
		h.Containers = cs
		h.Notes = append(h.Notes, notes...)
	}
	servers, notes, err := observeServers(o.Proc, h.Containers, o.Ports)
	if err != nil {
		return nil, err
	}
	h.Servers = servers
	h.Notes = append(h.Notes, notes...)
	h.Weights, notes = observeWeights(ctx, o.Proc, h.Servers, o.Hash)
	h.Notes = append(h.Notes, notes...)
	return h, nil
}

// ErrNoIncus is wrapped when the Incus socket named explicitly cannot be reached.
var ErrNoIncus = errors.New("incus socket not reachable")
