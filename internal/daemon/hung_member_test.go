package daemon

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus/incustest"
)

// incusCluster is this test binary's private three-member Incus cluster, formed by the
// first test that needs it (only the member tests: every other test runs without it).
var incusCluster = incustest.NewSharedCluster()

func TestMain(m *testing.M) { os.Exit(incusCluster.Run(m)) }

const memberPlan = `
variable "incus_socket" {}
variable "name" {}
agent { incus_socket = var.incus_socket }
container "c" {
  name         = var.name
  image        = "busybox"
  target       = "m2"
  stop_timeout = "10s"
}
`

// A container on a cluster member whose incusd hangs (SIGSTOP), under agent run: the
// member's watch reports it once ("change noticed"), and then the loop stays quiet while
// the member stays down: no watch fires again until the member's state changes, so the
// container is reconciled once for the notice and then only at its backoff or resync,
// not every few seconds for as long as the outage lasts. Once the member is back
// (SIGCONT), the container is observed again, and healthy, within seconds.
func TestHungMemberQuietUnderRun(t *testing.T) {
	c := incusCluster.Start(t)
	name := c.InstanceName(t)
	// A backoff of 3 minutes: the container is back within seconds of its member only if
	// the watch says so, and every reconcile while the member is down is one the watch
	// caused (each of its returns ends the backoff).
	const backoff = 3 * time.Minute
	base, logs := runReal(t, memberPlan, []string{"incus_socket=" + c.Socket, "name=" + name}, func(cfg *Config) {
		cfg.BackoffMin, cfg.BackoffMax = backoff, backoff
	})
	waitLong(t, "the container healthy on m2", 3*time.Minute, func() bool {
		r := statusOf(t, base, "container.c")
		return r.Status != nil && r.Status.Healthy
	})

	thaw := c.Hang(t, "m2")
	offline := time.Now()
	count := func(what string) int { return strings.Count(logs.String(), what) }
	lines := func() int { return strings.Count(logs.String(), "\n") - strings.Count(logs.String(), "level=DEBUG") }
	const notice = `msg="change noticed; reconciling now" resource=container.c`
	const failed = `msg="resource failed" resource=container.c`
	// The first to see it may be the watch or a resync; the watch, armed again after
	// the failure, reports it either way, once.
	waitLong(t, "the watch to report m2 down", 30*time.Second, func() bool { return count(notice) >= 1 && count(failed) >= 1 })
	n0, f0, l0 := count(notice), count(failed), lines()
	const window = 60 * time.Second
	time.Sleep(window)
	n, f, l := count(notice)-n0, count(failed)-f0, lines()-l0
	t.Logf("m2 Offline for %s; in the last %s: %d watch notices, %d failed reconciles, %d log lines", time.Since(offline).Round(time.Second), window, n, f, l)
	// At most the notice's own reconcile (the window may begin just before it ends).
	if n != 0 || f > 1 {
		t.Errorf("m2 down for %s: %d watch notices (want 0: reported once already) and %d failed reconciles (want at most 1, the notice's)", window, n, f)
	}

	const back = `msg="the instance's cluster member is online again; observing it now" resource=container.c`
	thaw()
	online := time.Now()
	waitLong(t, "the watch to report m2 back, and the container healthy", 20*time.Second, func() bool {
		r := statusOf(t, base, "container.c")
		return count(back) == 1 && r.Status != nil && r.Status.Healthy
	})
	t.Logf("the container healthy %s after the cluster reported m2 Online", time.Since(online).Round(time.Millisecond))
	waitLong(t, "the recovery logged", 10*time.Second, func() bool {
		return count(`msg="converged again: its last failure cleared without a change" resource=container.c`) == 1
	})
}
