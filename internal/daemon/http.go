package daemon

import (
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/view"
)

// handleStatus answers the same document as `agent status --json`, from the loop's latest
// observations (nothing is observed while the request waits, no engine is built; a
// resource whose step is in flight is observed after it, inflight.go), plus the state
// directory so `agent status` can tell whether this daemon manages its plan. Each
// resource's fields add what the loop knows: when it was last reconciled, since when it
// is down, its repairs, its next try and its recent failures (a crash loop's quote of
// each generation's log).
func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) {
	if d.observing.CompareAndSwap(false, true) {
		// In the background: /status answers at once with the last live observation.
		go func() { defer d.observing.Store(false); d.observeInFlight(d.work) }()
	}
	rep, p := d.report()
	if rep == nil {
		http.Error(w, "starting\n", http.StatusServiceUnavailable)
		return
	}
	d.mu.Lock()
	store, lastErr := d.store, d.lastErr
	d.mu.Unlock()
	red := view.NewRedactor(p.Secrets())
	doc := view.JSON("status", rep, red)
	doc.StateDir = store.Dir()
	if lastErr != "" {
		// What runs is the last good plan; the plan on disk is not: not ok, and why.
		doc.OK = false
		doc.Error = red.String(invalidPlanPrefix + lastErr)
	}
	w.Header().Set("Content-Type", "application/json")
	view.WriteJSON(w, doc)
}

// invalidPlanPrefix starts /status's error while the plan on disk does not load.
const invalidPlanPrefix = "the plan on disk is invalid; the last good plan keeps running: "

// handleHealth is the agent's own liveness: 200 while the loop runs and no step is past
// its own timeout (plus the grace). What is wrong besides (a plan on disk that does not
// load, a load that takes long) is said in warning lines.
func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	running, waiting, lastErr, loading := d.running, d.waiting, d.lastErr, d.loading
	red := view.NewRedactor(nil)
	if d.plan != nil {
		red = view.NewRedactor(d.plan.Secrets())
	}
	d.mu.Unlock()
	if !running {
		msg := "starting\n"
		if waiting != "" {
			msg = "waiting: " + waiting + "\n"
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	if stuck, why := d.stuck(time.Now()); stuck {
		http.Error(w, "stuck: "+why+"\n", http.StatusServiceUnavailable)
		return
	}
	msg := "ok: " + d.summaryLine() + "\n"
	if lastErr != "" {
		msg += "warning: the new plan is invalid; running the last good one: " + red.String(lastErr) + "\n"
	}
	if !loading.IsZero() {
		if took := time.Since(loading); took > time.Second {
			msg += fmt.Sprintf("warning: loading the plan has taken %s so far\n", took.Round(time.Second))
		}
	}
	w.Write([]byte(msg))
}

type metrics struct {
	reg         *prometheus.Registry
	reconciles  *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	failures    *prometheus.CounterVec
	drift       *prometheus.GaugeVec
	repairs     *prometheus.CounterVec
	repairTime  *prometheus.HistogramVec
	lastSuccess prometheus.Gauge
	planValid   prometheus.Gauge
	status      *statusCollector
}

// memoryCollector exports what the kinds keep in the loop's memory (agent.Memory) that is
// a Prometheus collector of its own (the GPU fault watch's agent_gpu_* families): the
// loop knows no kind, only that they collect. Unchecked: it describes nothing up front.
type memoryCollector struct{ mem *agent.Memory }

func (memoryCollector) Describe(chan<- *prometheus.Desc) {}

func (c memoryCollector) Collect(ch chan<- prometheus.Metric) {
	c.mem.Range(func(_ string, v any) bool {
		if col, ok := v.(prometheus.Collector); ok {
			col.Collect(ch)
		}
		return true
	})
}

// resourceLabels are the labels of every per-resource series, loop and status alike:
// the address in resource, the kind in kind, so that alerts join any two series on
// resource without label_replace (docs/service.md, "Metrics").
var resourceLabels = []string{"resource", "kind"}

// kindOf is the kind of an address ("server" of "server.qwen").
func kindOf(addr string) string { kind, _, _ := strings.Cut(addr, "."); return kind }

func newMetrics(d *Daemon) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_reconciles_total",
			Help: "Reconciles run (observe, act when needed, verify), by resource address."}, resourceLabels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "agent_reconcile_duration_seconds",
			Help: "Duration of reconciles, by resource address.", Buckets: prometheus.ExponentialBuckets(0.01, 4, 10)}, resourceLabels),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_reconcile_failures_total",
			Help: "Failed reconciles, and repairs needed again within the stable period (a crash loop), by resource address."}, resourceLabels),
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "agent_resource_drift",
			Help: "1 when the last reconcile found the resource different from the plan."}, resourceLabels),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "agent_repairs_total",
			Help: "Changes carried out and verified, by resource address."}, resourceLabels),
		repairTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "agent_time_to_repair_seconds",
			Help:    "From detection (a watch, or the observation that found the difference) to verified, by resource address.",
			Buckets: prometheus.ExponentialBuckets(0.1, 2, 16)}, resourceLabels),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agent_last_success_timestamp_seconds",
			Help: "Unix time of the last reconcile after which every resource was verified converged."}),
		planValid: prometheus.NewGauge(prometheus.GaugeOpts{Name: "agent_plan_valid",
			Help: "0 while the plan on disk does not load and the last good plan runs."}),
		status: &statusCollector{},
	}
	m.reg.MustRegister(m.reconciles, m.duration, m.failures, m.drift, m.repairs, m.repairTime, m.lastSuccess, m.planValid, m.status,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "agent_queue_depth",
			Help: "Resources queued for a worker."}, func() float64 { return float64(d.queue.Len()) }),
		&loopCollector{d: d}, memoryCollector{d.memory})
	// The agent's own process and runtime: up, memory, file descriptors, goroutines.
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// loopCollector exports what the loop knows of each resource, computed at scrape time.
type loopCollector struct{ d *Daemon }

var (
	downDesc = prometheus.NewDesc("agent_resource_down_seconds",
		"Seconds since the resource was found not converged (a server down); 0 while converged.", resourceLabels, nil)
	failingDesc = prometheus.NewDesc("agent_resource_failing",
		"1 while the resource's last reconcile failed (its error is in /status).", resourceLabels, nil)
	lastErrDesc = prometheus.NewDesc("agent_resource_last_error_timestamp_seconds",
		"Unix time of the resource's last failure (its text is in /status).", resourceLabels, nil)
	inRowDesc = prometheus.NewDesc("agent_resource_consecutive_failures",
		"Failures in a row; the backoff doubles with each.", resourceLabels, nil)
	inFlightDesc = prometheus.NewDesc("agent_resource_in_flight",
		"1 while a worker reconciles the resource.", resourceLabels, nil)
)

func (c *loopCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{downDesc, failingDesc, lastErrDesc, inRowDesc, inFlightDesc} {
		ch <- d
	}
}

func (c *loopCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	for addr, rs := range d.res {
		down := 0.0
		if !rs.downSince.IsZero() {
			down = now.Sub(rs.downSince).Seconds()
		}
		failing := rs.step != nil && rs.step.Err != nil && !held(rs.step.Err) || rs.failures > 0 && !rs.converged
		ch <- prometheus.MustNewConstMetric(downDesc, prometheus.GaugeValue, down, addr, kindOf(addr))
		ch <- prometheus.MustNewConstMetric(failingDesc, prometheus.GaugeValue, b(failing), addr, kindOf(addr))
		ch <- prometheus.MustNewConstMetric(inRowDesc, prometheus.GaugeValue, float64(rs.failures), addr, kindOf(addr))
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, b(rs.inFlight), addr, kindOf(addr))
		if n := len(rs.history); n > 0 {
			ch <- prometheus.MustNewConstMetric(lastErrDesc, prometheus.GaugeValue, float64(rs.history[n-1].at.Unix()), addr, kindOf(addr))
		}
	}
}

// statusCollector exports each resource's Status.Metrics as
// agent_<kind>_<key>{resource, kind, name}, and with member in a family where some resource
// names its cluster member (agent.MemberField): one family keeps one set of labels, so a
// resource without a member gets member="" there, which Prometheus reads as no label.
// name (the label; the address for agent_resource_healthy) is the label these series had
// alone before resource and kind: deprecated, kept for one release (docs/service.md).
type statusCollector struct {
	mu      sync.Mutex
	samples map[string][]statusSample // by resource address, each set as it changes
}

// set replaces addr's series.
func (c *statusCollector) set(addr string, s []statusSample) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.samples == nil {
		c.samples = map[string][]statusSample{}
	}
	c.samples[addr] = s
}

// keep drops the series of every resource not in addrs (gone from the plan).
func (c *statusCollector) keep(addrs []string) {
	in := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		in[a] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	maps.DeleteFunc(c.samples, func(a string, _ []statusSample) bool { return !in[a] })
}

type statusSample struct {
	kind, key, name string
	resource        string            // the address
	member          string            // the cluster member, "" when none
	labels          map[string]string // a series' own labels (agent.Series); nil for a plain number
	value           float64
}

// ownLabels are the labels the collector gives every status series: a series' own
// labels must not be one of them.
var ownLabels = map[string]bool{"resource": true, "kind": true, "name": true, "member": true}

var metricKey = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {} // unchecked collector: series vary with the plan

// Collect exports every sample with its family's label set: Prometheus wants one set of
// label names per metric name, and a family's samples may differ (a member on some, a
// series' own labels, a resource whose series lack a label another's have), so each
// family has the union of its samples' label names, "" where a sample has none. A
// sample with the label values of one already exported is dropped (a scrape would fail
// on it).
func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	all := slices.Concat(slices.Collect(maps.Values(c.samples))...)
	slices.SortStableFunc(all, func(a, b statusSample) int { return strings.Compare(a.resource, b.resource) })
	withMember := map[string]bool{}
	own := map[string]map[string]bool{} // family → its series' own label names
	for _, s := range all {
		f := s.kind + "_" + s.key
		if s.member != "" {
			withMember[f] = true
		}
		for k := range s.labels {
			if own[f] == nil {
				own[f] = map[string]bool{}
			}
			own[f][k] = true
		}
	}
	seen := map[string]bool{}
	for _, s := range all {
		f := s.kind + "_" + s.key
		labels, values := []string{"resource", "kind", "name"}, []string{s.resource, kindOf(s.resource), s.name}
		if withMember[f] {
			labels, values = append(labels, "member"), append(values, s.member)
		}
		for _, k := range slices.Sorted(maps.Keys(own[f])) {
			labels, values = append(labels, k), append(values, s.labels[k])
		}
		id := f + "\x00" + strings.Join(values, "\x00")
		if seen[id] {
			continue
		}
		seen[id] = true
		desc := prometheus.NewDesc("agent_"+f, "Observed "+strings.ReplaceAll(s.key, "_", " ")+" of each "+s.kind+".", labels, nil)
		if m, err := prometheus.NewConstMetric(desc, statusValueType(s.key), s.value, values...); err == nil {
			ch <- m
		}
	}
}

// statusValueType is how a status number is exported: a key ending in _total is a count
// the resource keeps in its own record across agent restarts (a server's reverts), so it
// only grows and is a counter (increase() works on it, as Prometheus' naming promises);
// every other key is a gauge.
func statusValueType(key string) prometheus.ValueType {
	if strings.HasSuffix(key, "_total") {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}
