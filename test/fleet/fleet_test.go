// Package fleet_test proves issue 31's fleet coordination against a real etcd (Debian's
// etcd-server 3.4, started on loopback by internal/coord/etcdtest): three `agent run`s,
// each with its own state directory, fake SGLang server and var file, share one plan
// whose server is in rollout group "qwen" with max_unavailable = 1. A sampler asks every
// server's /health every 20 ms and keeps the most that were down at once. The tests run
// in parallel: each has its own etcd, working directory, ports and etcd proxies.
package fleet_test

import (
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A flag change rolls across the three hosts one at a time, with one etcd member and
// with three; `agent status --fleet` lists every host and, once one dies, shows it
// unreachable.
func TestFleetRollout(t *testing.T) {
	t.Parallel()
	for _, members := range []int{1, 3} {
		t.Run(fmt.Sprintf("etcd_members=%d", members), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, members, 3, 3*time.Second, "1s")
			h.deploy("0.80")
			s := startSampler(h.hosts)
			h.writePlan("0.85")
			h.converged("0.85", 3*time.Minute)
			s.check(t, 1)
			for _, x := range h.hosts {
				if !strings.Contains(x.log(), "rollout: disrupting a member") {
					t.Errorf("%s never took a permit:\n%s", x.name, tail(x.log(), 3000))
				}
			}

			// The fleet view, from etcd alone: three reachable, healthy hosts, nothing in
			// flight (each host publishes within a quarter second of a change).
			var out string
			h.waitFor("status --fleet shows three healthy hosts and no rollout", 30*time.Second, func() bool {
				var doc map[string]any
				doc, out = h.fleetStatus(h.hosts[0])
				fl, _ := doc["fleet"].(map[string]any)
				hosts, _ := fl["hosts"].([]any)
				rs, _ := fl["rollouts"].([]any)
				if len(hosts) != 3 || len(rs) != 0 {
					return false
				}
				for _, e := range hosts {
					e := e.(map[string]any)
					sum, _ := e["summary"].(map[string]any)
					if e["reachable"] != true || sum == nil || sum["healthy"] != true {
						return false
					}
				}
				return true
			})
			t.Logf("agent status --fleet --json:\n%s", out)

			// A host that dies lapses: it is shown unreachable since its last word.
			h.hosts[2].kill()
			h.waitFor("h3 shown unreachable", 30*time.Second, func() bool {
				doc, _ := h.fleetStatus(h.hosts[0])
				for _, e := range doc["fleet"].(map[string]any)["hosts"].([]any) {
					e := e.(map[string]any)
					if e["host"] == "h3" {
						return e["reachable"] == false && e["updated"] != ""
					}
				}
				return false
			})
		})
	}
}

// SIGKILL of the agent holding the permit (its server relaunched, settling): the permit
// expires with its lease and the other hosts go on; the killed host's server keeps
// serving.
func TestFleetKilledPermitHolder(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, 3, 3*time.Second, "5s")
	h.deploy("0.80")
	s := startSampler(h.hosts)
	h.writePlan("0.85")
	holder := h.holder("a permit holder whose new server serves (settling)", func(x *host) bool { return x.runs("0.85") })
	killed := time.Now()
	holder.kill()
	t.Logf("killed %s's agent holding the permit", holder.name)
	h.waitFor("another host takes the permit", time.Minute, func() bool {
		ps, _, _ := h.permits()
		for _, p := range ps {
			if p.Host != holder.name && p.State == "disrupting" {
				return true
			}
		}
		return false
	})
	if d := time.Since(killed); d < 2*time.Second {
		t.Errorf("another host went on %s after the kill: before the killed agent's lease (3 s) could expire", d)
	}
	if !holder.serves() {
		t.Errorf("the killed agent's server stopped serving")
	}
	h.start(holder)
	h.converged("0.85", 3*time.Minute)
	s.check(t, 1)
}

// A partitioned agent (its etcd traffic stopped by its proxies) disrupts nothing; the
// others roll without it, also when it was cut off holding the permit, and it rolls
// when it is back.
func TestFleetPartition(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, 3, 3*time.Second, "1s")
	h.deploy("0.80")
	s := startSampler(h.hosts)

	// Cut off while idle: it must not restart while the others roll.
	cut := h.hosts[0]
	pid := cut.serverPID()
	cut.partition(true)
	h.writePlan("0.85")
	h.waitFor("the two others roll without h1", 3*time.Minute, func() bool {
		return h.hosts[1].runs("0.85") && h.hosts[2].runs("0.85")
	})
	time.Sleep(2 * h.lease)
	if p := cut.serverPID(); p != pid || !cut.serves() {
		t.Fatalf("the partitioned h1 restarted its server (pid %d → %d):\n%s", pid, p, tail(cut.log(), 3000))
	}
	cut.partition(false)
	h.converged("0.85", 3*time.Minute)

	// Cut off holding the permit: the others go on once its lease expires.
	h.writePlan("0.90")
	holder := h.holder("a permit taken", func(*host) bool { return true })
	holder.partition(true)
	t.Logf("%s cut off holding the permit", holder.name)
	h.waitFor("another host rolls", 2*time.Minute, func() bool {
		for _, x := range h.hosts {
			if x != holder && x.runs("0.90") {
				return true
			}
		}
		return false
	})
	holder.partition(false)
	h.converged("0.90", 3*time.Minute)
	s.check(t, 1)
}

// TestFleetRandomKills rolls FLEET_RUNS (default 2) flag changes while a killer SIGKILLs a
// random agent at random moments and starts it again (as systemd's Restart= does); the
// sampler records the most servers down at once. bench/fleet.sh runs 50.
func TestFleetRandomKills(t *testing.T) {
	t.Parallel()
	runs := 2
	if v, err := strconv.Atoi(os.Getenv("FLEET_RUNS")); err == nil && v > 0 {
		runs = v
	}
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("FLEET_SEED"), 10, 64); err == nil {
		seed = v
	}
	rng := rand.New(rand.NewSource(seed))
	h := newHarness(t, 1, 3, 4*time.Second, "1s")
	h.deploy("0.500")
	s := startSampler(h.hosts)
	kills := 0
	for run := 1; run <= runs; run++ {
		mem := fmt.Sprintf("0.%03d", 500+run)
		h.writePlan(mem)
		done := make(chan struct{})
		killed := make(chan int)
		go func() {
			n := 0
			defer func() { killed <- n }()
			for {
				select {
				case <-done:
					return
				case <-time.After(time.Duration(300+rng.Intn(2500)) * time.Millisecond):
				}
				x := h.hosts[rng.Intn(len(h.hosts))]
				x.kill()
				n++
				pause := time.Duration(100+rng.Intn(900)) * time.Millisecond
				t.Logf("%s: SIGKILLed %s's agent, starting it again in %s", time.Now().Format(time.StampMilli), x.name, pause)
				time.Sleep(pause)
				h.start(x)
			}
		}()
		h.converged(mem, 5*time.Minute)
		close(done)
		kills += <-killed
		for _, x := range h.hosts { // every agent runs again before the next change
			x.mu.Lock()
			stopped := x.cmd == nil
			x.mu.Unlock()
			if stopped {
				h.start(x)
			}
		}
		h.converged(mem, 2*time.Minute)
	}
	peak := s.check(t, 1)
	t.Logf("FLEET RESULT: runs=%d kills=%d most_down_at_once=%d seed=%d", runs, kills, peak, seed)
}

func (x *host) runsFunc(mem string) func() bool { return func() bool { return x.runs(mem) } }

// `agent apply` takes the same permits as `agent run`: one host applies by hand while
// another host's loop holds the permit; the apply waits for it (naming it), then goes.
func TestFleetApplySharesPermits(t *testing.T) {
	t.Parallel()
	h := newHarness(t, 1, 3, 3*time.Second, "3s")
	h.deploy("0.80")
	manual := h.hosts[0]
	manual.kill() // this host is driven by hand now
	s := startSampler(h.hosts)
	h.writePlan("0.85")
	holder := h.holder("a loop holds the permit", func(x *host) bool { return x != manual })
	cmd := exec.Command(h.agentBin, "apply", h.planDir, "-var-file", manual.varFile, "--state-dir", manual.state)
	cmd.Env = append(os.Environ(), "HOME="+h.work)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("agent apply: %v\n%s", err, out)
	}
	t.Logf("agent apply on %s:\n%s", manual.name, out)
	if !strings.Contains(string(out), "rollout: waiting for the group") || !strings.Contains(string(out), "on "+holder.name) {
		t.Errorf("the apply did not wait for %s's permit:\n%s", holder.name, out)
	}
	h.converged("0.85", 3*time.Minute)
	s.check(t, 1)
}
