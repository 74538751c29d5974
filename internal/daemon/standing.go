package daemon

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/agent-dev/agent/agent"
)

// shape is what the loop asks of an engine's graph at every turn, computed once per
// engine: the engine sorts its graph at each Addrs or Dependents call, and with 10,000
// resources waiting on one download a call per turn was quadratic (issue 27).
type shape struct {
	addrs      []string            // eng.Addrs(): orphans first, then the plan in order
	dependents map[string][]string // direct dependents, in dependency order
}

func newShape(eng *agent.Engine) *shape {
	sh := &shape{addrs: eng.Addrs(), dependents: map[string][]string{}}
	for _, a := range sh.addrs { // an orphan waits for what still needs it (Engine.Deps)
		for _, dep := range eng.Deps(a) {
			sh.dependents[dep] = append(sh.dependents[dep], a)
		}
	}
	return sh
}

// category is a resource's standing in the STATUS= line.
type category int

const (
	catPending category = iota // not observed yet, or in progress
	catConverged
	catFailing
	catWaiting // for a dependency
	nCategories
)

// categoryOf is addr's standing (under d.mu).
func (d *Daemon) categoryOf(rs *resState) category {
	switch {
	case rs == nil || rs.step == nil:
		return catPending
	case rs.converged && rs.gen == d.engGen:
		return catConverged
	case rs.step.Err != nil && !held(rs.step.Err) || rs.failures > 0:
		return catFailing
	}
	var w *WaitingError
	if rs.step.Err != nil && errors.As(rs.step.Err, &w) {
		return catWaiting
	}
	return catPending
}

// recount updates addr's standing and the counts (under d.mu).
func (d *Daemon) recount(addr string) {
	if d.standing == nil {
		return
	}
	old, ok := d.standing[addr]
	if !ok {
		return // not a resource of the current engine
	}
	now := d.categoryOf(d.res[addr])
	if now != old {
		d.counts[old]--
		d.counts[now]++
		d.standing[addr] = now
	}
}

// republish computes every resource's standing and series anew: a new engine (a
// reload) changes them all. The only O(resources) publish.
func (d *Daemon) republish() {
	d.mu.Lock()
	d.standing = make(map[string]category, len(d.shape.addrs))
	d.counts = [nCategories]int{}
	for _, a := range d.shape.addrs {
		c := d.categoryOf(d.res[a])
		d.standing[a] = c
		d.counts[c]++
	}
	addrs := d.shape.addrs
	d.mu.Unlock()
	d.metrics.status.keep(addrs)
	d.publish(addrs...)
}

// publish refreshes what the loop shows of the resources that changed: their standing,
// their status series and the STATUS= line (sent when it changed). Its cost is the
// changed resources', whatever the plan's size.
func (d *Daemon) publish(changed ...string) {
	defer func() {
		select {
		case d.published <- struct{}{}:
		default:
		}
	}()
	d.mu.Lock()
	type update struct {
		addr    string
		samples []statusSample
	}
	var updates []update
	for _, a := range changed {
		d.recount(a)
		if d.standing == nil {
			continue
		}
		if _, ok := d.standing[a]; !ok {
			continue
		}
		updates = append(updates, update{a, d.samplesOf(a)})
	}
	line := d.summaryLocked()
	send := line != d.summary
	d.summary = line
	d.mu.Unlock()
	for _, u := range updates {
		d.metrics.status.set(u.addr, u.samples)
	}
	if send {
		d.notify.status(line)
	}
}

// summaryLine is the one-line STATUS= for systemctl status.
func (d *Daemon) summaryLine() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.summaryLocked()
}

func (d *Daemon) summaryLocked() string {
	if !d.running {
		if d.waiting != "" {
			return "waiting: " + d.waiting
		}
		return "starting"
	}
	s := fmt.Sprintf("%d resources: %d converged, %d failing", len(d.shape.addrs), d.counts[catConverged], d.counts[catFailing])
	if n := d.counts[catWaiting]; n > 0 {
		s += fmt.Sprintf(", %d waiting for dependencies", n)
	}
	if n := d.counts[catPending]; n > 0 {
		s += fmt.Sprintf(", %d in progress", n)
	}
	if d.lastErr != "" {
		s += "; new plan invalid, running the last good one"
	}
	return s
}

// allConverged reports whether every resource of the current engine last verified
// converged (under d.mu, with the changed resource recounted).
func (d *Daemon) allConverged() bool {
	return d.standing != nil && d.counts[catConverged] == len(d.shape.addrs)
}

// stepFor is addr's entry of the status report: its latest observations, with its
// recent failures and repair facts among its fields (under d.mu).
func (d *Daemon) stepFor(addr string, now time.Time) *agent.Step {
	st := &agent.Step{Addr: addr}
	rs := d.res[addr]
	acting := rs != nil && rs.inFlight && rs.action != ""
	if rs == nil || (rs.step == nil && !acting) {
		st.Status = &agent.Status{Summary: "not observed yet"}
		return st
	}
	if rs.step != nil {
		st.Diff, st.Err, st.Duration = rs.step.Diff, rs.step.Err, rs.step.Duration
	}
	var s agent.Status
	if rs.status != nil && rs.status.Status != nil {
		s = *rs.status.Status
		s.Fields = slices.Clone(s.Fields)
		s.Metrics = maps.Clone(s.Metrics)
		s.Series = slices.Clone(s.Series)
	}
	var w *WaitingError
	switch {
	case acting:
		// What happens now, not the last outcome (inflight.go).
		st.Diff, st.Err = nil, nil
		s = *inFlightStatus(rs, now)
	case errors.As(st.Err, &w) && w.Cause == "":
		// Waiting for a dependency that is on its way: not converged (exit 3), not an
		// error of its own (exit 1); a dependency that failed keeps its error.
		st.Err, s.Summary = nil, w.Error()
	default:
		if rs.converged && st.Err == nil && rs.step != nil && rs.step.Applied {
			// Applied and verified: what stands now is no change, not the step's diff.
			st.Diff = agent.NoChange()
		}
		if rs.status != nil && rs.status.Err != nil && st.Err == nil {
			st.Err = rs.status.Err
		}
	}
	if st.Err != nil || !rs.converged {
		s.Healthy = false
		if s.Summary == "" {
			s.Summary = "not converged"
		}
	}
	if !rs.done.IsZero() {
		s.Fields = append(s.Fields, agent.TimeField("reconciled_at", "reconciled", rs.done))
	}
	if !rs.downSince.IsZero() {
		s.Fields = append(s.Fields, agent.TimeField("down_since", "down since", rs.downSince))
	}
	if rs.repairs > 0 {
		s.Fields = append(s.Fields, agent.NumberField("repairs", "repairs", rs.repairs))
	}
	if rs.until.After(now) {
		s.Fields = append(s.Fields, agent.DurationField("next_try_seconds", "next try", rs.until.Sub(now)).WithText(fmt.Sprintf("in %s (%d failures in a row)", rs.until.Sub(now).Round(100*time.Millisecond), rs.failures)))
	}
	for i, f := range rs.history {
		s.Fields = append(s.Fields, agent.TextField(fmt.Sprintf("failure[%d]", i+1), fmt.Sprintf("failure %d", i+1), f.err).WithText(agent.HumanTime(f.at)+" "+f.err))
	}
	st.Status = &s
	return st
}

// samplesOf is addr's status series: agent_resource_healthy and each number its status
// reports, agent_<kind>_<key> (under d.mu). An orphan has none: its block is gone.
func (d *Daemon) samplesOf(addr string) []statusSample {
	r := d.plan.Resource(addr)
	if r == nil {
		return nil
	}
	rs := d.res[addr]
	if rs == nil || rs.step == nil {
		return []statusSample{{kind: "resource", key: "healthy", name: addr, resource: addr}}
	}
	healthy := 0.0
	err := rs.step.Err
	if err == nil && rs.status != nil {
		err = rs.status.Err
	}
	var st *agent.Status
	if rs.status != nil {
		st = rs.status.Status
	}
	if err == nil && rs.converged && st != nil && st.Healthy {
		healthy = 1
	}
	member := st.Member()
	out := []statusSample{{kind: "resource", key: "healthy", name: addr, resource: addr, member: member, value: healthy}}
	if st == nil {
		return out
	}
	for _, k := range slices.Sorted(maps.Keys(st.Metrics)) {
		if metricKey.MatchString(k) {
			out = append(out, statusSample{kind: r.Type, key: k, name: r.Name, resource: addr, member: member, value: st.Metrics[k]})
		}
	}
	for _, s := range st.Series {
		if seriesOK(s) {
			out = append(out, statusSample{kind: r.Type, key: s.Name, name: r.Name, resource: addr, member: member, labels: maps.Clone(s.Labels), value: s.Value})
		}
	}
	return out
}

// seriesOK reports whether a status series can be exported: a metric name and label
// names as Prometheus has them, none of them a label the collector adds itself.
func seriesOK(s agent.Series) bool {
	if !metricKey.MatchString(s.Name) {
		return false
	}
	for k := range s.Labels {
		if !metricKey.MatchString(k) || ownLabels[k] {
			return false
		}
	}
	return true
}
