package daemon

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// Issue 29 point 2: while agent run launches a server (slow to load), /status says what
// happens now, with no error (agent status exits 3, degraded, not 1): the server
// "creating, for N s: …" with the applying fields, what depends on it "waiting for
// server.qwen to converge". Once verified, /status shows what stands (no-op, no
// changes), not the finished step's action and changes.
func TestStatusDuringALaunchSaysWhatHappensNow(t *testing.T) {
	t.Parallel()
	fake, root := fakeRoot(t)
	src := serverPlan + `
file "after" {
  path       = "${var.root}/after"
  content    = "x"
  depends_on = [server.qwen]
}
`
	base, _ := runReal(t, src, []string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t)),
		"faults=slow-start=6s", "settle=1s"}, nil)
	var seen bool
	waitLong(t, "the launch in flight, said", 30*time.Second, func() bool {
		srv, after := statusOf(t, base, "server.qwen"), statusOf(t, base, "file.after")
		if srv.Status == nil || !strings.HasPrefix(srv.Status.Summary, "creating, for ") {
			return false
		}
		seen = true
		if srv.Error != "" || srv.Status.Healthy || srv.Action != "" {
			t.Errorf("server in flight: error %q, healthy %v, action %q; want no error, not healthy, no action", srv.Error, srv.Status.Healthy, srv.Action)
		}
		var applying bool
		for _, f := range srv.Status.Fields {
			applying = applying || (f.Key == "applying" && f.Value == "create")
		}
		if !applying {
			t.Errorf("server in flight lacks the applying field: %+v", srv.Status.Fields)
		}
		if after.Error != "" || after.Status == nil || after.Status.Summary != "waiting for server.qwen to converge" {
			t.Errorf("its dependent: error %q, status %+v; want no error and the wait", after.Error, after.Status)
		}
		// Observed live after a request or two: its generation, not ready yet.
		if strings.Contains(srv.Status.Summary, "generation 1") {
			t.Logf("/status in flight: %s", srv.Status.Summary)
			return true
		}
		return false
	})
	if !seen {
		t.Fatal("never saw the launch in flight")
	}
	waitLong(t, "generation 1 verified", 60*time.Second, func() bool {
		r := statusOf(t, base, "server.qwen")
		return r.Status != nil && r.Status.Healthy
	})
	if r := statusOf(t, base, "server.qwen"); r.Action != "no-op" || len(r.Changes) != 0 || r.Error != "" {
		t.Errorf("after the verified launch: action %q, changes %v, error %q; want no-op and none", r.Action, r.Changes, r.Error)
	}
}
