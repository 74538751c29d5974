package daemon

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestStatusMetricsMemberLabel: a family where a resource names its cluster member
// carries member="…" on every series (empty for a resource without one, so the family
// keeps one label set, which a pedantic registry checks); other families keep {name}.
func TestStatusMetricsMemberLabel(t *testing.T) {
	c := &statusCollector{}
	c.set("server.qwen_m2", []statusSample{{kind: "server", key: "up", name: "qwen_m2", member: "m2", value: 1}})
	c.set("server.local", []statusSample{{kind: "server", key: "up", name: "local", value: 1}})
	c.set("file.f", []statusSample{{kind: "file", key: "size", name: "f", value: 3}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var pairs []string
			for _, lp := range m.GetLabel() {
				pairs = append(pairs, lp.GetName()+"="+lp.GetValue())
			}
			got[mf.GetName()+"{"+strings.Join(pairs, ",")+"}"] = true
		}
	}
	for _, want := range []string{"agent_server_up{member=m2,name=qwen_m2}", "agent_server_up{member=,name=local}", "agent_file_size{name=f}"} {
		if !got[want] {
			t.Errorf("no series %s in %v", want, got)
		}
	}
}
