package daemon

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestStatusMetricsMemberLabel: every status series says its resource (the address) and
// kind (issue 29, point 5), with the deprecated name beside them for one release; a
// family where a resource names its cluster member carries member="…" on every series
// (empty for a resource without one, so the family keeps one label set, which a pedantic
// registry checks).
func TestStatusMetricsMemberLabel(t *testing.T) {
	c := &statusCollector{}
	c.set("server.qwen_m2", []statusSample{{kind: "server", key: "up", name: "qwen_m2", resource: "server.qwen_m2", member: "m2", value: 1}})
	c.set("server.local", []statusSample{{kind: "server", key: "up", name: "local", resource: "server.local", value: 1}})
	c.set("file.f", []statusSample{{kind: "file", key: "size", name: "f", resource: "file.f", value: 3}})
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
	for _, want := range []string{"agent_server_up{kind=server,member=m2,name=qwen_m2,resource=server.qwen_m2}",
		"agent_server_up{kind=server,member=,name=local,resource=server.local}", "agent_file_size{kind=file,name=f,resource=file.f}"} {
		if !got[want] {
			t.Errorf("no series %s in %v", want, got)
		}
	}
}

// TestStatusMetricsCounters: a status number whose key ends in _total (a server's
// reverts, kept in its record) is exported as a counter, every other one as a gauge.
func TestStatusMetricsCounters(t *testing.T) {
	c := &statusCollector{}
	c.set("server.qwen", []statusSample{
		{kind: "server", key: "reverts_total", name: "qwen", value: 2},
		{kind: "server", key: "rolled_back", name: "qwen", value: 1},
	})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	types := map[string]string{}
	for _, mf := range mfs {
		types[mf.GetName()] = mf.GetType().String()
	}
	if types["agent_server_reverts_total"] != "COUNTER" || types["agent_server_rolled_back"] != "GAUGE" {
		t.Errorf("types %v, want agent_server_reverts_total a COUNTER and agent_server_rolled_back a GAUGE", types)
	}
}
