package resources

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/prometheus/client_golang/prometheus"
)

// HostFaults is the GPU fault watch of one host and its judgements (docs/gpu.md, "When a
// GPU fails"), shared by the kinds through the loop's memory (agent.Memory): the server
// kind's watches poll it under `agent run` and act on the judgements of the GPUs their
// servers use; the nvidia_driver kind reads the reboots they ask for.
type HostFaults struct {
	polling sync.Mutex // one poll at a time (the watch is read by one goroutine); held through its reads
	mu      sync.Mutex // the fields below; never held through a read of the host
	root    string
	watch   *gpu.FaultWatch
	obs     gpu.Observer
	book    gpu.Book
	devices []gpu.Device
	seenAt  time.Time // when devices were observed
	polled  time.Time
}

// logFaultsPerPoll is how many new faults one poll quotes in the log.
const logFaultsPerPoll = 10

// FaultPoll is how often the fault watch reads the kernel log and NVML.
const FaultPoll = time.Second

// FaultsKey names m's fault watch in the loop's memory: an observation reads it with
// agent.Recall[*HostFaults], and finds none where nothing polls it (`agent apply`, or no
// server watched).
func FaultsKey(m Machine) string { return "gpu faults " + m.Root }

// FaultsOf is m's fault watch in env's memory, made on first use (by the watches that
// poll it, and a GPU reset that reads it again).
func FaultsOf(env *agent.Env, m Machine) *HostFaults {
	obs := m.GPU
	var health gpu.HealthSource
	if obs == nil {
		obs, health = gpu.Default(m.Root), gpu.DefaultHealth()
	}
	x, _ := env.Memory.LoadOrStore(FaultsKey(m), &HostFaults{root: m.Root, obs: obs, watch: &gpu.FaultWatch{Root: m.Root, Health: health}})
	return x.(*HostFaults)
}

// Poll reads what is new, at most once per FaultPoll, and logs each new fault.
func (h *HostFaults) Poll(ctx context.Context, env *agent.Env) {
	if !h.polling.TryLock() {
		return // another watch is polling now
	}
	defer h.polling.Unlock()
	now := env.Now()
	h.mu.Lock()
	due, stale, devices := now.Sub(h.polled) >= FaultPoll, now.Sub(h.seenAt) > 30*time.Second || h.devices == nil, h.devices
	if due {
		h.polled = now
	}
	h.mu.Unlock()
	if !due {
		return
	}
	if stale {
		if info, err := h.obs.Observe(ctx); err == nil {
			devices = info.GPUs
			h.mu.Lock()
			h.devices, h.seenAt = devices, now
			h.mu.Unlock()
		}
	}
	faults, health, err := h.watch.Poll(ctx, devices)
	if err != nil {
		env.Log.Warn("GPU fault watch", "error", err)
	}
	fresh := h.book.Record(BootID(h.root), now, faults, health)
	if len(fresh) > logFaultsPerPoll {
		// A burst: the first ones quoted, the rest counted (agent_gpu_xid_total has them all).
		env.Log.Warn("GPU fault burst: the first ones follow, the rest are counted in agent_gpu_xid_total", "faults", len(fresh), "quoted", logFaultsPerPoll)
		fresh = fresh[:logFaultsPerPoll]
	}
	for _, f := range fresh {
		attrs := []any{"gpu", f.GPU, "pci", f.PCIBusID, "xid", f.Xid, "action", f.Action.String(), "line", f.Line}
		if f.GPU < 0 {
			env.Log.Warn("GPU fault on a PCI bus id this host has no GPU at: reported, nothing done", attrs...)
			continue
		}
		env.Log.Warn("GPU fault", attrs...)
	}
}

// Devices are the GPUs last observed.
func (h *HostFaults) Devices() []gpu.Device {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.devices
}

// Book is the judgements, one per GPU.
func (h *HostFaults) Book() *gpu.Book { return &h.book }

// Reboots are the GPUs whose judgement asks for the machine to be rebooted.
func (h *HostFaults) Reboots() []gpu.Judgement {
	var out []gpu.Judgement
	for _, j := range h.book.All() {
		if j.Standing == gpu.ActionReboot && j.Cause != nil {
			out = append(out, j)
		}
	}
	return out
}

// Escalate makes GPU index's judgement a reboot: a reset that could not be done or did
// not help (why).
func (h *HostFaults) Escalate(env *agent.Env, index int, why string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := gpu.Fault{At: env.Now(), GPU: index, Kind: gpu.FaultResetFailed, Text: why, Source: "agent", Action: gpu.ActionReboot}
	for _, d := range h.devices {
		if d.Index == index {
			f.PCIBusID, f.UUID = d.PCIBusID, d.UUID
		}
	}
	h.book.Record(h.book.Boot(), f.At, []gpu.Fault{f}, nil)
}

// Healthy reads GPU index again, at once, after a reset: "" when it is seen and NVML
// reports no problem on it (its judgement is then cleared), else what is wrong.
func (h *HostFaults) Healthy(ctx context.Context, env *agent.Env, index int) string {
	h.polling.Lock()
	defer h.polling.Unlock()
	info, err := h.obs.Observe(ctx)
	if err != nil {
		return err.Error()
	}
	h.mu.Lock()
	h.devices, h.seenAt = info.GPUs, env.Now()
	h.mu.Unlock()
	seen := false
	for _, d := range info.GPUs {
		seen = seen || d.Index == index
	}
	if !seen || info.State != gpu.StateOK {
		return fmt.Sprintf("GPU %d is not seen (%s)", index, info.State)
	}
	var health []gpu.Health
	if h.watch.Health != nil {
		var err error
		if health, _, err = h.watch.Health.Health(ctx); err != nil {
			return err.Error()
		}
	}
	for _, hl := range health {
		if hl.Index == index {
			if p := hl.Problems(env.Now()); len(p) > 0 {
				return p[0].Text
			}
		}
	}
	h.book.Clear(index)
	return ""
}

// BootID is this boot's id under root ("" is "/"); "" when unknown.
func BootID(root string) string {
	if root == "" {
		root = "/"
	}
	b, _ := os.ReadFile(filepath.Join(root, "proc", "sys", "kernel", "random", "boot_id"))
	return strings.TrimSpace(string(b))
}

var (
	gpuXidDesc = prometheus.NewDesc("agent_gpu_xid_total",
		"Xid errors seen on each GPU this boot (kernel log and NVML), by code (docs/gpu.md, When a GPU fails).", []string{"gpu", "xid"}, nil)
	gpuHealthyDesc = prometheus.NewDesc("agent_gpu_healthy",
		"0 while a GPU's faults ask for a reset or a reboot (or NVML reports a problem on it), else 1.", []string{"gpu"}, nil)
	gpuLostDesc = prometheus.NewDesc("agent_gpu_lost",
		"1 when a GPU is lost: fallen off the bus (Xid 79) or NVML's GPU is lost.", []string{"gpu"}, nil)
	gpuECCDesc = prometheus.NewDesc("agent_gpu_ecc_uncorrectable_total",
		"Uncorrectable ECC errors over the GPU's life (NVML's aggregate count); only where NVML reports it.", []string{"gpu"}, nil)
	gpuRemapPendingDesc = prometheus.NewDesc("agent_gpu_remap_pending",
		"1 while a row remap waits for a GPU reset; only where NVML reports row remapping.", []string{"gpu"}, nil)
	gpuRemapFailedDesc = prometheus.NewDesc("agent_gpu_remap_failed",
		"1 when a row remap failed; only where NVML reports row remapping.", []string{"gpu"}, nil)
)

// Describe implements prometheus.Collector.
func (h *HostFaults) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{gpuXidDesc, gpuHealthyDesc, gpuLostDesc, gpuECCDesc, gpuRemapPendingDesc, gpuRemapFailedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the agent_gpu_* families, one series per GPU
// the host has (and per GPU and code for Xids), exported by `agent run` from the loop's
// memory.
func (h *HostFaults) Collect(ch chan<- prometheus.Metric) {
	judged := map[int]gpu.Judgement{}
	for _, j := range h.book.All() {
		judged[j.GPU] = j
	}
	gpus := map[int]bool{}
	for _, d := range h.Devices() {
		gpus[d.Index] = true
	}
	for i := range judged {
		gpus[i] = true
	}
	for i := range gpus {
		idx := strconv.Itoa(i)
		j := judged[i]
		for code, n := range j.XidTotal {
			ch <- prometheus.MustNewConstMetric(gpuXidDesc, prometheus.CounterValue, float64(n), idx, strconv.Itoa(code))
		}
		healthy, lost := 1.0, 0.0
		if j.Standing >= gpu.ActionResetGPU {
			healthy = 0
		}
		if c := j.Cause; c != nil && (c.Kind == gpu.FaultLost || c.Kind == gpu.FaultXid && c.Xid == 79) {
			lost = 1
		}
		if hl := j.Health; hl != nil {
			if len(hl.Problems(time.Time{})) > 0 {
				healthy = 0
			}
			if hl.Lost {
				lost = 1
			}
			if hl.ECCKnown {
				ch <- prometheus.MustNewConstMetric(gpuECCDesc, prometheus.CounterValue, float64(hl.ECCAggregate), idx)
			}
			if hl.RemapKnown {
				ch <- prometheus.MustNewConstMetric(gpuRemapPendingDesc, prometheus.GaugeValue, b2f(hl.RemapPending), idx)
				ch <- prometheus.MustNewConstMetric(gpuRemapFailedDesc, prometheus.GaugeValue, b2f(hl.RemapFailed), idx)
			}
		}
		ch <- prometheus.MustNewConstMetric(gpuHealthyDesc, prometheus.GaugeValue, healthy, idx)
		ch <- prometheus.MustNewConstMetric(gpuLostDesc, prometheus.GaugeValue, lost, idx)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
