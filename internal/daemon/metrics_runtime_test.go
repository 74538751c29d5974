package daemon

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestMetricsHaveProcessAndGoSeries: /metrics carries the standard process_ and go_
// series, so the usual dashboards and alerts (memory, file descriptors, restarts through
// process_start_time_seconds) work on the agent as on any Go exporter.
func TestMetricsHaveProcessAndGoSeries(t *testing.T) {
	rec := httptest.NewRecorder()
	d := &Daemon{res: map[string]*resState{}, queue: newWorkQueue()}
	newMetrics(d).handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, name := range []string{"process_resident_memory_bytes", "process_start_time_seconds", "process_open_fds", "go_goroutines", "go_memstats_alloc_bytes"} {
		if !strings.Contains(string(body), "\n"+name+" ") {
			t.Errorf("/metrics has no %s", name)
		}
	}
}
