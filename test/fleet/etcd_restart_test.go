package fleet_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/docs/schema"
	"github.com/agent-dev/agent/internal/testbin"
)

// etcd's own failures, on one fleet (three etcd members, lease 3 s), one after another
// under one sampler (every 20 ms): never two servers down at once.
//
//   - etcd killed mid-rollout and back 20 s later with its data: the member in flight
//     finishes, no other host disrupts while etcd is gone, every agent keeps its lease
//     (live again within 2 s of etcd answering), the rollout resumes;
//   - etcd killed before a change is made and back 30 s later: meanwhile `agent status
//     --fleet` exits 1 and, with --hosts, shows each agent's own /status; the leases are
//     kept and the fleet converges within 15 s of etcd's return;
//   - etcd back on empty data directories at the moment a host's server goes down in its
//     restart, once with each host first (the others kept off etcd until it holds the
//     permit, then waiting for it): no other host takes a permit before that host wrote
//     its own again (the new epoch's fence).
//
// FLEET_WIPES (default 1) repeats the last scenario's round of three; bench/fleet-etcd.sh
// runs many.
func TestFleetEtcdRestarts(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 3, 3, 3*time.Second, "1s")
	h.deploy("0.80")
	s := startSampler(h.hosts)

	// 1. Down 20 s mid-rollout, back with its data.
	h.writePlan("0.81")
	holder := h.holder("a permit taken", func(*host) bool { return true })
	ids, pids := h.leaseIDs(), h.serverPIDs()
	h.etcd.StopAll()
	down := time.Now()
	t.Logf("etcd stopped while %s holds the permit", holder.name)
	h.waitFor(holder.name+" finishes its restart without etcd", time.Minute, holder.runsFunc("0.81"))
	h.noRestartUntil(down.Add(20*time.Second), pids, holder)
	h.etcd.RestartAll()
	late := h.leasesKept(ids, down, time.Now())
	h.converged("0.81", 2*time.Minute)

	// 2. Down 30 s with a change made meanwhile: nothing moves, the view says why, and
	// the change rolls within 15 s of etcd's return.
	ids, pids = h.leaseIDs(), h.serverPIDs()
	h.etcd.StopAll()
	down = time.Now()
	h.writePlan("0.82")
	h.fleetStatusWithoutEtcd()
	h.noRestartUntil(down.Add(30*time.Second), pids, nil)
	h.etcd.RestartAll()
	back := time.Now()
	late = max(late, h.leasesKept(ids, down, back))
	h.converged("0.82", 15*time.Second-time.Since(back))
	converged := time.Since(back)
	t.Logf("converged %s after etcd answered", converged.Round(10*time.Millisecond))

	// 3. Back without its data at the moment a member goes down, each host first.
	rounds := 1
	if n, err := fmt.Sscan(os.Getenv("FLEET_WIPES"), &rounds); n != 1 || err != nil || rounds < 1 {
		rounds = 1
	}
	for r := range rounds {
		for i, first := range h.hosts {
			mem := fmt.Sprintf("0.%d", 830+10*r+i)
			// first goes first: the others are cut off from etcd until it holds the
			// permit, then race for the next one while its server is down.
			for _, x := range h.hosts {
				x.partition(x != first)
			}
			h.writePlan(mem)
			h.holder(first.name+" takes the permit", func(x *host) bool { return x == first })
			for _, x := range h.hosts {
				x.partition(false)
			}
			h.waitFor(first.name+"'s server goes down in its restart", time.Minute, func() bool { return !first.serves() })
			before := epochsSeen(h.hosts)
			h.etcd.RestartAllEmpty()
			t.Logf("etcd back on empty data directories while %s's server is down", first.name)
			h.waitFor("every agent finds that etcd lost its state", 30*time.Second, func() bool {
				now := epochsSeen(h.hosts)
				for j := range now {
					if now[j] <= before[j] {
						return false
					}
				}
				return true
			})
			h.converged(mem, 2*time.Minute)
		}
	}
	peak := s.check(t, 1)
	t.Logf("FLEET ETCD RESULT: wipes=%d most_down_at_once=%d leases_live_again_within=%s converged_after_30s_outage=%s",
		3*rounds, peak, late.Round(time.Millisecond), converged.Round(10*time.Millisecond))
}

// epochsSeen counts, per host, the times its agent found that etcd lost its state.
func epochsSeen(hosts []*host) []int {
	var out []int
	for _, x := range hosts {
		out = append(out, strings.Count(x.log(), "coordination: etcd lost its state"))
	}
	return out
}

// leaseIDs are the agents' lease IDs, as their state directories record them.
func (h *harness) leaseIDs() map[string]string {
	h.t.Helper()
	out := map[string]string{}
	for _, x := range h.hosts {
		b, err := os.ReadFile(filepath.Join(x.state, "coordination-lease"))
		if err != nil {
			h.t.Fatalf("%s records no lease: %v", x.name, err)
		}
		out[x.name] = strings.Fields(string(b))[0]
	}
	return out
}

func (h *harness) serverPIDs() map[string]int {
	pids := map[string]int{}
	for _, x := range h.hosts {
		pids[x.name] = x.serverPID()
	}
	return pids
}

// noRestartUntil fails the test if a host but except restarts its server before until:
// etcd is down, no live lease, nothing may be disrupted.
func (h *harness) noRestartUntil(until time.Time, pids map[string]int, except *host) {
	h.t.Helper()
	for time.Now().Before(until) {
		for _, x := range h.hosts {
			if x == except {
				continue
			}
			if pid := x.serverPID(); pid != pids[x.name] {
				h.t.Fatalf("%s restarted its server (pid %d → %d) while etcd was down:\n%s", x.name, pids[x.name], pid, tail(x.log(), 3000))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, x := range h.hosts {
		if !x.serves() {
			h.t.Errorf("%s's server does not serve while etcd is down", x.name)
		}
		if !strings.Contains(x.log(), "lease lapsed") {
			h.t.Errorf("%s never said its lease lapsed:\n%s", x.name, tail(x.log(), 2000))
		}
	}
}

// leasesKept waits until every agent logs its lease live again after down, and fails
// the test unless it is the lease it had (ids) and it was live within 2 s of etcd
// answering (etcd's health answered at back at the latest). It returns the latest.
func (h *harness) leasesKept(ids map[string]string, down, back time.Time) time.Duration {
	h.t.Helper()
	var latest time.Duration
	for _, x := range h.hosts {
		var at time.Time
		var lease string
		h.waitFor(x.name+"'s lease live again", 30*time.Second, func() bool {
			at, lease = leaseLive(x.log(), down)
			return !at.IsZero()
		})
		h.t.Logf("%s: lease %s live again %s after etcd answered", x.name, lease, at.Sub(back).Round(time.Millisecond))
		if lease != ids[x.name] {
			h.t.Errorf("%s has lease %s after etcd's restart with its data, want %s kept", x.name, lease, ids[x.name])
		}
		d := at.Sub(back)
		if d > 2*time.Second {
			h.t.Errorf("%s's lease was live again %s after etcd answered; want within 2 s", x.name, d)
		}
		latest = max(latest, d)
	}
	return latest
}

// leaseLive is the first "etcd lease live" the log says after since, and the lease.
func leaseLive(log string, since time.Time) (time.Time, string) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "coordination: etcd lease live") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || !at.After(since) {
			continue
		}
		_, lease, _ := strings.Cut(line, " lease=")
		lease, _, _ = strings.Cut(lease, " ")
		return at, lease
	}
	return time.Time{}, ""
}

// fleetStatusWithoutEtcd: with etcd down, `agent status --fleet` exits 1 within its 10 s
// and names --hosts; with --hosts it shows each agent's own /status, and says which
// address it could not read.
func (h *harness) fleetStatusWithoutEtcd() {
	h.t.Helper()
	dead := fmt.Sprintf("127.0.0.1:%d", testbin.FreePort(h.t))
	var addrs []string
	for _, x := range h.hosts {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", x.listen))
	}
	all := strings.Join(append(addrs, dead), ",")
	// In text, with --hosts, at the same time as the plain one.
	type result struct {
		out, errOut string
		code        int
	}
	text := make(chan result, 1)
	go func() {
		out, errOut, code := h.agentStatus("status", "--fleet", "--hosts", all, h.planDir, "-var-file", h.hosts[0].varFile)
		text <- result{out, errOut, code}
	}()
	start := time.Now()
	out, errOut, code := h.agentStatus("status", "--fleet", h.planDir, "-var-file", h.hosts[0].varFile)
	took := time.Since(start)
	h.t.Logf("agent status --fleet without etcd: exit %d after %s: %s%s", code, took.Round(time.Millisecond), out, errOut)
	if code != 1 || !strings.Contains(errOut, "etcd") || !strings.Contains(errOut, "--hosts") {
		h.t.Errorf("agent status --fleet without etcd: exit %d, want 1 naming etcd and --hosts:\n%s%s", code, out, errOut)
	}
	if took > 20*time.Second {
		h.t.Errorf("agent status --fleet without etcd took %s (its limit is 10 s)", took)
	}
	r := <-text
	h.t.Logf("agent status --fleet --hosts without etcd: exit %d:\n%s%s", r.code, r.out, r.errOut)
	if r.code != 1 || !strings.Contains(r.out, "etcd cannot be read") || strings.Count(r.out, "last known from") != 3 ||
		!strings.Contains(r.out, dead) || !strings.Contains(r.out, "cannot read its /status") {
		h.t.Errorf("agent status --fleet --hosts without etcd: want exit 1, three agents' own /status and %s unreadable", dead)
	}
	out, _, code = h.agentStatus("status", "--fleet", "--json", "--hosts", all, h.planDir, "-var-file", h.hosts[0].varFile)
	if err := schema.Validate([]byte(out)); err != nil {
		h.t.Errorf("agent status --fleet --hosts --json does not match docs/schema: %v\n%s", err, out)
	}
	var doc struct {
		OK    bool   `json:"ok"`
		Error string `json:"error"`
		Fleet struct {
			Hosts []struct {
				Host, From, Error string
				Summary           *struct {
					Resources []struct{ Address string }
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 1 || doc.OK || doc.Error == "" || len(doc.Fleet.Hosts) != 4 {
		h.t.Fatalf("agent status --fleet --json --hosts without etcd: exit %d, %v:\n%s", code, err, out)
	}
	for i, e := range doc.Fleet.Hosts {
		if i < 3 && (e.From == "" || e.Summary == nil || len(e.Summary.Resources) != 1 || e.Summary.Resources[0].Address != "server.qwen") {
			h.t.Errorf("host %s: want its own /status, with server.qwen:\n%s", e.Host, out)
		}
		if i == 3 && (e.Host != dead || e.Error == "" || e.Summary != nil) {
			h.t.Errorf("host %s: want an error, no summary:\n%s", e.Host, out)
		}
	}
	h.t.Logf("agent status --fleet --json --hosts without etcd:\n%s", out)
}

// agentStatus runs the agent with args and returns its stdout, its stderr and its exit
// code.
func (h *harness) agentStatus(args ...string) (string, string, int) {
	h.t.Helper()
	cmd := exec.Command(h.agentBin, args...)
	cmd.Env = append(os.Environ(), "HOME="+h.work)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		h.t.Fatalf("agent %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}
