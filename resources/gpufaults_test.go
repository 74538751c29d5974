package resources

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
)

type twoGPUs struct{}

func (twoGPUs) Observe(context.Context) (gpu.Info, error) {
	return gpu.Info{State: gpu.StateOK, Source: gpu.SourceNVML, GPUs: []gpu.Device{{Index: 0, PCIBusID: "0000:01:00.0"}, {Index: 1, PCIBusID: "0000:41:00.0"}}}, nil
}

type healthNow []gpu.Health

func (h healthNow) Health(context.Context) ([]gpu.Health, []gpu.Fault, error) { return h, nil, nil }
func (healthNow) Close() error                                                { return nil }

// The agent_gpu_* families: ECC and row remapping from NVML's health, healthy 0 for a GPU
// whose health asks for a reset, and one series per GPU the host has.
func TestHostFaultsMetrics(t *testing.T) {
	env := &agent.Env{Memory: agent.NewMemory(), Now: time.Now, Log: slog.New(slog.DiscardHandler)}
	h := FaultsOf(env, Machine{Root: t.TempDir(), GPU: twoGPUs{}})
	h.watch.Health = healthNow{
		{Index: 0, PCIBusID: "0000:01:00.0", ECCKnown: true, ECCAggregate: 3, RemapKnown: true},
		{Index: 1, PCIBusID: "0000:41:00.0", ECCKnown: true, ECCAggregate: 7, RemapKnown: true, RemapPending: true},
	}
	h.Poll(context.Background(), env)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(h)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			got = append(got, fmt.Sprintf("%s{gpu=%q} %g", f.GetName(), m.GetLabel()[0].GetValue(), v))
		}
	}
	want := []string{
		`agent_gpu_ecc_uncorrectable_total{gpu="0"} 3`, `agent_gpu_ecc_uncorrectable_total{gpu="1"} 7`,
		`agent_gpu_healthy{gpu="0"} 1`, `agent_gpu_healthy{gpu="1"} 0`,
		`agent_gpu_lost{gpu="0"} 0`, `agent_gpu_lost{gpu="1"} 0`,
		`agent_gpu_remap_failed{gpu="0"} 0`, `agent_gpu_remap_failed{gpu="1"} 0`,
		`agent_gpu_remap_pending{gpu="0"} 0`, `agent_gpu_remap_pending{gpu="1"} 1`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("metrics\n got %q\nwant %q", got, want)
	}
}
