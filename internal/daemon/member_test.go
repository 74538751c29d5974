package daemon

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agent-dev/agent/agent"
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

// TestStatusSeriesLabels: a status series (agent.Series) is exported with the resource's
// labels and its own; the families stay one label set each when the resources' series
// disagree (a label one lacks is ""), a series repeated is exported once, and a series
// naming a label of the collector's own is not exported: a pedantic gather has no error
// and nothing panics.
func TestStatusSeriesLabels(t *testing.T) {
	c := &statusCollector{}
	c.set("server.a", []statusSample{
		{kind: "server", key: "start_phase_seconds", name: "a", resource: "server.a", labels: map[string]string{"phase": "ready"}, value: 40},
		{kind: "server", key: "start_phase_seconds", name: "a", resource: "server.a", labels: map[string]string{"phase": "ready"}, value: 41},
		{kind: "server", key: "start_phase_seconds", name: "a", resource: "server.a", labels: map[string]string{"phase": "weights_loaded"}, value: 190},
	})
	c.set("server.b", []statusSample{
		{kind: "server", key: "start_phase_seconds", name: "b", resource: "server.b", labels: map[string]string{"phase": "ready", "rank": "0"}, value: 7},
		{kind: "server", key: "start_phase_seconds", name: "b", resource: "server.b", value: 8},
	})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var got []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var pairs []string
			for _, lp := range m.GetLabel() {
				pairs = append(pairs, lp.GetName()+"="+lp.GetValue())
			}
			got = append(got, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(pairs, ","), m.GetGauge().GetValue()))
		}
	}
	slices.Sort(got)
	want := []string{
		"agent_server_start_phase_seconds{kind=server,name=a,phase=ready,rank=,resource=server.a} 40",
		"agent_server_start_phase_seconds{kind=server,name=a,phase=weights_loaded,rank=,resource=server.a} 190",
		"agent_server_start_phase_seconds{kind=server,name=b,phase=,rank=,resource=server.b} 8",
		"agent_server_start_phase_seconds{kind=server,name=b,phase=ready,rank=0,resource=server.b} 7",
	}
	if !slices.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, s := range []agent.Series{{Name: "x", Labels: map[string]string{"resource": "y"}}, {Name: "x", Labels: map[string]string{"Phase": "y"}}, {Name: "X"}} {
		if seriesOK(s) {
			t.Errorf("series %+v would be exported", s)
		}
	}
	if !seriesOK(agent.Series{Name: "start_phase_seconds", Labels: map[string]string{"phase": "ready"}}) {
		t.Error("a good series is not exported")
	}
}
