package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/view"
)

// What /status says while a resource's step is in flight (issue 29, point 2): not the
// last reconcile's outcome (a wait for a dependency that has since converged, the
// previous step's action and changes), but what happens now, "restarting, for 40 s:
// generation 2 running, not ready: loading weights", healthy false and no error, so that
// `agent status` exits 3 (degraded), not 1, for the minutes a real launch takes.

// liveFor is how long a live observation of a resource in flight serves /status before
// the next request observes it again.
const liveFor = 2 * time.Second

// acting maps the engine's actions, as a step's phase names them, to what /status says.
var acting = map[string]string{
	string(agent.Create): "creating", string(agent.Update): "updating", string(agent.Restart): "restarting",
	string(agent.Replace): "replacing", string(agent.Delete): "deleting",
}

// observeInFlight observes, after a /status request, the resources whose action is in
// flight and whose live status is older than liveFor (rs.live): the kind's Status, a
// cheap observation (never a probe), made only when someone asks, so that a launch
// nobody watches costs nothing, and never while the request waits (the next one gets
// it; one observer at a time, Daemon.observing).
func (d *Daemon) observeInFlight(ctx context.Context) {
	type job struct {
		addr  string
		rs    *resState
		since time.Time
	}
	d.mu.Lock()
	eng, gen := d.eng, d.engGen
	var jobs []job
	for addr, rs := range d.res {
		if rs.inFlight && rs.action != "" && rs.progress == nil && time.Since(rs.liveAt) > liveFor {
			jobs = append(jobs, job{addr, rs, rs.actionStart})
		}
	}
	d.mu.Unlock()
	for _, j := range jobs {
		if eng == nil || !eng.Has(j.addr) {
			continue
		}
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st := eng.StatusOf(octx, j.addr, nil)
		cancel()
		d.mu.Lock()
		if j.rs.actionStart.Equal(j.since) && d.engGen == gen {
			j.rs.live, j.rs.liveAt = st, time.Now()
		}
		d.mu.Unlock()
	}
}

// inFlightStatus is what report shows for a resource whose action is in flight: its
// live status (when observed yet) with the action and how long it has run in front, and
// the fields applying and applying_since (under d.mu).
func inFlightStatus(rs *resState, now time.Time) *agent.Status {
	var s agent.Status
	if rs.live != nil && rs.live.Status != nil {
		s = *rs.live.Status
		s.Fields = append([]agent.Field(nil), s.Fields...)
	}
	took := now.Sub(rs.actionStart).Round(time.Second)
	what := strings.TrimPrefix(s.Summary, "degraded, ") // expected while it acts
	for _, f := range s.Fields {
		if f.Key == "ready" && strings.HasPrefix(f.Text, "not ready: ") {
			what = strings.Replace(what, "not ready", f.Text, 1) // why: the newest log line
		}
	}
	if rs.progress != nil {
		what = view.Standing(*rs.progress) // its own progress says more, for nothing
	}
	if what == "" {
		what = "not observed yet"
	}
	s.Healthy = false
	s.Summary = fmt.Sprintf("%s, for %s: %s", acting[rs.action], took, what)
	s.Fields = append(s.Fields,
		agent.TextField("applying", "applying", rs.action).WithText(fmt.Sprintf("%s, for %s", rs.action, took)),
		agent.TimeField("applying_since", "applying since", rs.actionStart))
	return &s
}
