package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/fleet"
)

// The fleet for people: a line per host (an unreachable one since when, with what it last
// said), then the rollouts with each permit's holder and fencing revision.
func TestWriteFleet(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 42, 30, 0, time.UTC)
	at := func(s int) time.Time { return now.Add(-time.Duration(s) * time.Second) }
	ok := func(h string) *fleet.Summary {
		return &fleet.Summary{Host: h, Healthy: true, Resources: []fleet.ResourceSummary{{Address: "server.qwen", Healthy: true}, {Address: "download.qwen", Healthy: true}}}
	}
	st := &fleet.Status{Prefix: "/agent/prod", Hosts: []fleet.HostStatus{
		{Host: "kpro5", Reachable: true, Updated: at(1), Summary: ok("kpro5")},
		{Host: "kpro6", Reachable: true, Updated: at(1), Summary: &fleet.Summary{Host: "kpro6", Resources: []fleet.ResourceSummary{
			{Address: "server.qwen", Summary: "not converged", Error: "rollout qwen: waiting: max_unavailable = 1 and 1 member is unavailable: server.qwen on kpro7 (restart not verified yet)"},
			{Address: "download.qwen", Healthy: true}}}},
		{Host: "kpro7", Reachable: false, Updated: at(95), Summary: ok("kpro7")},
	}, Rollouts: []coord.Group{{Name: "qwen", Permits: []coord.Permit{{Group: "qwen", Host: "kpro7", Member: "server.qwen", State: coord.Disrupting, Action: "restart", Since: at(100), Revision: 812}}}}}
	var b strings.Builder
	writeFleet(&b, st, now)
	want := `Fleet /agent/prod: 3 hosts, 1 unreachable
  kpro5  healthy: 2/2 resources healthy
  kpro6  degraded: 1/2 resources healthy; server.qwen: rollout qwen: waiting: max_unavailable = 1 and 1 member is unavailable: server.qwen on kpro7 (restart not verified yet)
  kpro7  unreachable since 2026-12-03T10:40:55Z (1m35s ago; lease lapsed), last known: 2/2 resources healthy
Rollouts in flight:
  qwen: server.qwen on kpro7 (restart not verified yet) since 2026-12-03T10:40:50Z (permit revision 812)
`
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	st.Rollouts[0].Stop = &coord.Stop{Group: "qwen", Host: "kpro7", Member: "server.qwen", Reason: "restart: exited with status 1: CUDA out of memory\ntraceback", Since: at(60)}
	b.Reset()
	writeFleet(&b, st, now)
	if want := "  qwen: stopped since 2026-12-03T10:41:30Z: server.qwen failed on kpro7: restart: exited with status 1: CUDA out of memory\n"; !strings.Contains(b.String(), want) {
		t.Errorf("the stop is not shown as %q:\n%s", want, b.String())
	}
}

// A host under disruption, for people: who, what, since when, how long the permit is held.
func TestWriteFleetHostPermits(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 16, 30, 0, time.Local)
	st := &fleet.Status{Prefix: "/agent/prod", HostPermits: []coord.HostPermit{{Group: "gpu-hosts", Host: "kpro6", Cause: "driver",
		Detail: "driver 580.95.05 → 590.48.01", State: coord.HostRebooting, Since: time.Date(2026, 12, 3, 10, 4, 10, 0, time.Local)}}}
	var b strings.Builder
	writeFleet(&b, st, now)
	want := "Hosts under disruption:\n  kpro6 rebooting since 10:04 (driver 580.95.05 → 590.48.01), permit held 12m (host group gpu-hosts; agent fleet release kpro6 frees it)\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("got\n%s\nwant it to hold\n%s", b.String(), want)
	}
	if !st.Degraded() {
		t.Error("a fleet with a host under disruption is not degraded")
	}
	// Its install failed: the step, since when, the error quoted line by line, the stop.
	st.HostPermits[0].State = coord.HostFailed
	st.HostPermits[0].Failure = &coord.HostFailure{Step: coord.StepInstall, At: time.Date(2026, 12, 3, 10, 6, 0, 0, time.Local),
		Error: "installer failed: exit status 1; last lines:\nERROR: Unable to build the NVIDIA kernel module."}
	b.Reset()
	writeFleet(&b, st, now)
	want = "Hosts under disruption:\n  kpro6 failed at install since 10:06 (driver 580.95.05 → 590.48.01), permit held 12m (host group gpu-hosts; agent fleet release kpro6 frees it)\n" +
		"    error: installer failed: exit status 1; last lines:\n           │ ERROR: Unable to build the NVIDIA kernel module.\n" +
		"    host group gpu-hosts is stopped: no other host starts until kpro6 is verified (fix it: it resumes by itself) or freed\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("got\n%s\nwant it to hold\n%s", b.String(), want)
	}
}
