package daemon

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/plans"
)

// handleStatus answers the same document as `agent status --json`, observed now, plus the
// state directory so `agent status` can tell whether this daemon manages its plan.
func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	p, store := d.plan, d.store
	d.mu.Unlock()
	eng, err := agent.New(p, d.cfg.Kinds, store, d.cfg.Engine)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Minute)
	defer cancel()
	rep := eng.Status(ctx)
	doc := agent.JSON("status", rep, p, agent.NewRedactor(p.Secrets()))
	doc.StateDir = store.Dir()
	d.metrics.setStatus(rep, p)
	w.Header().Set("Content-Type", "application/json")
	agent.WriteJSON(w, doc)
}

// handleHealth is the agent's own liveness: 200 while the loop finishes passes.
func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	last, lastErr := d.lastPass, d.lastErr
	d.mu.Unlock()
	if last.IsZero() {
		http.Error(w, "starting: no pass finished yet\n", http.StatusServiceUnavailable)
		return
	}
	if stuck, _ := d.stuck(time.Now()); stuck {
		http.Error(w, "stuck: no pass finished for "+time.Since(last).Round(time.Second).String()+"\n", http.StatusServiceUnavailable)
		return
	}
	msg := "ok: last pass " + last.Format(time.RFC3339) + "\n"
	if lastErr != "" {
		msg += "warning: the new plan is invalid; running the last good one\n"
	}
	w.Write([]byte(msg))
}

type metrics struct {
	reg         *prometheus.Registry
	passes      prometheus.Counter
	duration    prometheus.Histogram
	failures    *prometheus.CounterVec
	drift       *prometheus.GaugeVec
	lastSuccess prometheus.Gauge
	planValid   prometheus.Gauge
	status      *statusCollector
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		passes: prometheus.NewCounter(prometheus.CounterOpts{Name: "agent_reconcile_passes_total",
			Help: "Reconcile passes run."}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "agent_reconcile_duration_seconds",
			Help: "Duration of reconcile passes.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_reconcile_failures_total",
			Help: "Failed resource steps, by resource address."}, []string{"resource"}),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "agent_resource_drift",
			Help: "1 when the last pass found the resource different from the plan."}, []string{"resource"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agent_last_success_timestamp_seconds",
			Help: "Unix time of the last pass in which every resource converged."}),
		planValid: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agent_plan_valid",
			Help: "0 while the plan on disk does not load and the last good plan runs."}),
		status: &statusCollector{},
	}
	m.reg.MustRegister(m.passes, m.duration, m.failures, m.drift, m.lastSuccess, m.planValid, m.status)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

func (m *metrics) observePass(rep *agent.Report, elapsed time.Duration) {
	m.passes.Inc()
	m.duration.Observe(elapsed.Seconds())
	ok := true
	for _, st := range rep.Steps {
		if st.Err != nil {
			ok = false
		}
		if held(st.Err) {
			continue // not looked at this pass: its drift and failures stand as they were
		}
		drift := 0.0
		if st.Diff != nil && st.Diff.Action != agent.NoOp {
			drift = 1
		}
		m.drift.WithLabelValues(st.Addr).Set(drift)
		if st.Err != nil {
			if _, skipped := st.Skipped(); !skipped {
				m.failures.WithLabelValues(st.Addr).Inc()
			}
		}
	}
	if ok {
		m.lastSuccess.SetToCurrentTime()
	}
}

// setStatus keeps the latest per-resource status metrics for scraping.
func (m *metrics) setStatus(rep *agent.Report, p *plans.Plan) {
	var samples []statusSample
	for _, st := range rep.Steps {
		r := p.Resource(st.Addr)
		if r == nil {
			continue
		}
		healthy := 0.0
		if st.Err == nil && st.Status != nil && st.Status.Healthy {
			healthy = 1
		}
		member := st.Status.Member()
		samples = append(samples, statusSample{kind: "resource", key: "healthy", name: st.Addr, member: member, value: healthy})
		if st.Status == nil {
			continue
		}
		for k, v := range st.Status.Metrics {
			if metricKey.MatchString(k) {
				samples = append(samples, statusSample{kind: r.Type, key: k, name: r.Name, member: member, value: v})
			}
		}
	}
	m.status.mu.Lock()
	m.status.samples = samples
	m.status.mu.Unlock()
}

// statusCollector exports each resource's Status.Metrics as agent_<kind>_<key>{name}, and
// {name, member} in a family where some resource names its cluster member
// (agent.MemberField): one family keeps one set of labels, so a resource without a member
// gets member="" there, which Prometheus reads as no label.
type statusCollector struct {
	mu      sync.Mutex
	samples []statusSample
}

type statusSample struct {
	kind, key, name string
	member          string // the cluster member, "" when none
	value           float64
}

var metricKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {} // unchecked collector: series vary with the plan

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	withMember := map[string]bool{}
	for _, s := range c.samples {
		if s.member != "" {
			withMember[s.kind+"_"+s.key] = true
		}
	}
	for _, s := range c.samples {
		labels, values := []string{"name"}, []string{s.name}
		if withMember[s.kind+"_"+s.key] {
			labels, values = append(labels, "member"), append(values, s.member)
		}
		desc := prometheus.NewDesc("agent_"+s.kind+"_"+s.key, "Observed "+strings.ReplaceAll(s.key, "_", " ")+" of each "+s.kind+".", labels, nil)
		if m, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, s.value, values...); err == nil {
			ch <- m
		}
	}
}
