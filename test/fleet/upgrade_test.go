package fleet_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/testbin"
)

const (
	driverOld = "570.172.08"
	driverNew = "580.95.05"
)

// upgrade is a fleet whose hosts each have a fake host root (AGENT_HOST_ROOT) with an
// NVIDIA driver, and a command runner (AGENT_HOST_RUNNER) whose systemctl reboot is the
// test's reboot hook: it marks the host as rebooting and hangs, as a host going down
// does; the test then kills the agent and its server, writes a new boot id and the
// installed driver as loaded into the root, and starts the agent again after a pause
// longer than the lease. Each host's agent runs in its own UTS and mount namespaces
// (hostNamespaces): its fleet name is its hostname, its root and state directory the
// same paths as the other hosts'.
type upgrade struct {
	*harness
	installers map[string]string // version → the .run's URL
	sums       map[string]string
	boots      int
	// killFirst: the first host to ask for its reboot has its agent SIGKILLed instead
	// (between the reboot's record and the reboot) and started again in the same boot.
	killFirst bool
	// max is host_disruptions' max_unavailable (and the server's rollout group's).
	max int
}

// newUpgrade is a fleet of n hosts on driver driverOld; deploy starts it.
func newUpgrade(t *testing.T, n int) *upgrade {
	t.Helper()
	u := &upgrade{harness: newHarness(t, 1, n, 2*time.Second, "1s"), installers: map[string]string{}, sums: map[string]string{}, max: 1}
	u.hostNamespaces()
	mux := http.NewServeMux()
	for _, v := range []string{driverOld, driverNew} {
		// A fake NVIDIA .run: installs libnvidia-ml.so.V under the agent's host root;
		// the module loads at the next boot (the reboot hook). It fails on a host whose
		// root has an install-fails file beside it.
		script := fmt.Appendf(nil, `#!/bin/sh
for a in "$@"; do case "$a" in --log-file-name=*) log="${a#--log-file-name=}"; echo "installing %[1]s" > "$log" ;; esac; done
if [ -e "$AGENT_HOST_ROOT/../install-fails" ]; then echo "ERROR: Unable to build the NVIDIA kernel module." >> "$log"; exit 1; fi
lib="$AGENT_HOST_ROOT/usr/lib/x86_64-linux-gnu"
: > "$lib/libnvidia-ml.so.%[1]s"
ln -sfn "libnvidia-ml.so.%[1]s" "$lib/libnvidia-ml.so.1"
`, v)
		name := "/NVIDIA-Linux-x86_64-" + v + ".run"
		mux.HandleFunc(name, func(w http.ResponseWriter, _ *http.Request) { w.Write(script) })
		sum := sha256.Sum256(script)
		u.sums[v] = hex.EncodeToString(sum[:])
		u.installers[v] = name
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	for v, p := range u.installers {
		u.installers[v] = srv.URL + p
	}
	runner := filepath.Join(u.work, "host-runner")
	if err := os.WriteFile(runner, []byte(`#!/bin/sh
# The fake host's commands: the installer runs, systemctl reboot marks the host and
# hangs until the test kills the agent (the reboot), the rest succeed.
case "$1" in
/bin/sh) shift; exec /bin/sh "$@" ;;
systemctl) date +%s.%N > "$AGENT_HOST_ROOT/../reboot-requested"; exec sleep 600 ;;
esac
exit 0
`), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, x := range u.hosts {
		root := u.root(x)
		u.boot(x, driverOld)
		lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
		writeFile(t, filepath.Join(root, "proc/driver/nvidia/gpus/0000:01:00.0/information"), "Model: \t\t NVIDIA RTX A6000\nBus Location: \t 0000:01:00.0\n")
		writeFile(t, filepath.Join(root, "proc/modules"), "nvidia 11313152 2 - Live 0x0000000000000000 (POE)\n")
		writeFile(t, filepath.Join(lib, "libnvidia-ml.so."+driverOld), "")
		if err := os.Symlink("libnvidia-ml.so."+driverOld, filepath.Join(lib, "libnvidia-ml.so.1")); err != nil {
			t.Fatal(err)
		}
		x.env = []string{"AGENT_HOST_ROOT=" + u.hostPath(x, root), "AGENT_HOST_RUNNER=" + runner}
	}
	return u
}

func (u *upgrade) root(x *host) string { return filepath.Join(u.work, x.name, "root") }

// boot writes a new boot id into x's root, with driver loaded.
func (u *upgrade) boot(x *host, driver string) {
	u.t.Helper()
	u.boots++
	root := u.root(x)
	writeFile(u.t, filepath.Join(root, "proc/sys/kernel/random/boot_id"), fmt.Sprintf("5d1f2a3c-0000-4000-8000-%012d\n", u.boots))
	writeFile(u.t, filepath.Join(root, "proc/driver/nvidia/version"),
		"NVRM version: NVIDIA UNIX x86_64 Kernel Module  "+driver+"  Tue Sep 23 09:55:41 UTC 2025\n")
	writeFile(u.t, filepath.Join(root, "sys/module/nvidia/version"), driver+"\n")
}

func (u *upgrade) loaded(x *host) string {
	b, _ := os.ReadFile(filepath.Join(u.root(x), "sys/module/nvidia/version"))
	return strings.TrimSpace(string(b))
}

// rebootAsked reports whether x's agent ran systemctl reboot (and clears the mark).
func (u *upgrade) rebootAsked(x *host) bool {
	return os.Remove(filepath.Join(u.work, x.name, "reboot-requested")) == nil
}

// goDown is the reboot's first half: x's agent (with the hanging systemctl) and its
// server die.
func (u *upgrade) goDown(x *host) {
	u.t.Helper()
	pid := x.serverPID()
	x.mu.Lock()
	if x.cmd != nil {
		syscall.Kill(-x.cmd.Process.Pid, syscall.SIGKILL)
	}
	x.mu.Unlock()
	x.kill()
	if pid > 0 {
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	u.waitFor(x.name+"'s server gone in its reboot", 10*time.Second, func() bool { return !x.serves() })
}

// writePlan writes the shared plan: the driver at version (reboot = "allowed") and the
// server, with coordination (no name: each host's hostname) and host_disruptions {
// max_unavailable = u.max }.
func (u *upgrade) writePlan(version string) {
	u.t.Helper()
	src := fmt.Sprintf(`variable "fake" {}
variable "host" {}
variable "port" { type = number }
variable "listen" {}
variable "etcd" { type = list(string) }
variable "logs" {}

agent {
  interval       = "2s"
  metrics_listen = var.listen
  coordination {
    etcd   = var.etcd
    prefix = %q
    lease  = "%ds"
    host_disruptions {
      max_unavailable = %d
    }
  }
}

nvidia_driver "host" {
  version = %q
  installer {
    url    = %q
    sha256 = %q
  }
  reboot = "allowed"
}
`, prefix, int(u.lease/time.Second), u.max, version, u.installers[version], u.sums[version]) + testbin.GroupServer{Name: "qwen", Command: "var.fake", Port: "var.port",
		Mem: `"0.80"`, Settle: u.settle, LogDir: "var.logs", Group: "qwen", Max: u.max, Env: strconv.Quote("slow-start=1s")}.HCL()
	tmp := filepath.Join(u.work, "plan.hcl.tmp")
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		u.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(u.planDir, "main.hcl")); err != nil {
		u.t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// hostRecord is one host's upgrade as the test saw it: taken is when its host permit
// was taken (the permit's own since), the others when the test's 100 ms loop saw the
// step (asked: its reboot requested; down: its agent and server gone; up: its agent
// started again in the new boot; released: its permit gone from etcd).
type hostRecord struct {
	taken, asked, down, up, released time.Time
	oldPID                           int
	killed                           bool // SIGKILLed at its first reboot request (killFirst)
}

// run drives the upgrade to driver version: every 100 ms it serves the reboot hook (a
// host that asked for its reboot goes down, and comes back after pause with version
// loaded, unless it is in never) and checks each host permit's release: only once that
// host serves again, from a new server on version. It returns when every host not in
// never was released, or fails after limit.
func (u *upgrade) run(version string, limit, pause time.Duration, never map[string]bool) map[string]*hostRecord {
	u.t.Helper()
	recs := map[string]*hostRecord{}
	for _, x := range u.hosts {
		recs[x.name] = &hostRecord{oldPID: x.serverPID()}
	}
	deadline := time.Now().Add(limit)
	for {
		held := map[string]bool{}
		for _, p := range u.hostPermits() {
			key, value, _ := strings.Cut(p, " ")
			for _, x := range u.hosts {
				if strings.HasSuffix(key, "/holders/"+x.name) {
					held[x.name] = true
					var hp coord.HostPermit
					if r := recs[x.name]; r.taken.IsZero() && json.Unmarshal([]byte(value), &hp) == nil {
						r.taken = hp.Since
					}
				}
			}
		}
		done := true
		for _, x := range u.hosts {
			r := recs[x.name]
			switch {
			case u.killFirst && r.asked.IsZero() && u.rebootAsked(x):
				u.killFirst, r.killed = false, true
				x.mu.Lock()
				syscall.Kill(-x.cmd.Process.Pid, syscall.SIGKILL)
				x.mu.Unlock()
				x.kill()
				u.start(x) // the same boot: it must ask for the reboot again
			case r.asked.IsZero() && u.rebootAsked(x):
				r.asked = time.Now()
				if !held[x.name] {
					u.t.Errorf("%s asked for its reboot without holding the host permit", x.name)
				}
				u.goDown(x)
				r.down = time.Now()
			case !r.down.IsZero() && r.up.IsZero() && !never[x.name] && time.Since(r.down) >= pause:
				u.boot(x, version)
				u.start(x)
				r.up = time.Now()
			case !r.up.IsZero() && r.released.IsZero() && !held[x.name]:
				r.released = time.Now()
				if !x.serves() || x.serverPID() == r.oldPID || u.loaded(x) != version {
					u.t.Errorf("%s's host permit was released before it served again on driver %s (serves %v, server pid %d → %d, driver %s)",
						x.name, version, x.serves(), r.oldPID, x.serverPID(), u.loaded(x))
				}
			}
			if !never[x.name] && r.released.IsZero() {
				done = false
			}
		}
		if done {
			return recs
		}
		if time.Now().After(deadline) {
			for _, x := range u.hosts {
				u.t.Logf("--- %s's agent log (tail):\n%s", x.name, tail(x.log(), 3000))
			}
			u.t.Fatalf("the upgrade did not finish in %s: %+v, host permits %q", limit, recs, u.hostPermits())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A driver version change written to the three hosts' plan at once upgrades them one
// host at a time: each takes the host permit, installs, asks for its reboot, comes back
// on the new driver and releases the permit only once its server serves again; the
// sampler never sees two hosts' servers down at once, and each host's outage lies within
// its permit. The first host's agent is SIGKILLed as it asks for its reboot: started
// again in the same boot, it asks again. UPGRADE_ROUNDS (default 1) repeats the upgrade,
// back and forth between the two drivers, without kills after the first round;
// bench/upgrade.sh runs it so and keeps the figures each round logs.
func TestDriverUpgradeOneHostAtATime(t *testing.T) {
	u := newUpgrade(t, 3)
	u.killFirst = true
	u.writePlan(driverOld)
	for _, x := range u.hosts {
		u.start(x)
	}
	u.converged("0.80", 2*time.Minute)

	rounds := 1
	if n, err := fmt.Sscan(os.Getenv("UPGRADE_ROUNDS"), &rounds); n != 1 || err != nil || rounds < 1 {
		rounds = 1
	}
	var all []upgradeFigures
	killed, peak, from := 0, 0, driverOld
	for round := 1; round <= rounds; round++ {
		to := driverNew
		if from == driverNew {
			to = driverOld
		}
		figs, p := u.round(round, from, to)
		all, peak, from = append(all, figs...), max(peak, p), to
		for _, f := range figs {
			if f.killed {
				killed++
			}
		}
	}
	for _, x := range u.hosts {
		if !strings.Contains(x.log(), "host disruption over: driver and servers verified, host permit released") {
			t.Errorf("%s's agent log does not say it released its host permit", x.name)
		}
	}
	if killed != 1 {
		t.Errorf("%d agents were SIGKILLed at their reboot request, want 1", killed)
	}
	for _, f := range all {
		if f.killed && !strings.Contains(f.host.log(), "the reboot an earlier agent asked for did not happen: asking again") {
			t.Errorf("%s's restarted agent does not say it asks for the reboot again", f.host.name)
		}
	}
	if ps := u.hostPermits(); len(ps) != 0 {
		t.Fatalf("host permits left: %q", ps)
	}
	t.Logf("UPGRADE RESULT: %s", summary(all, rounds, len(u.hosts), peak))
}

// upgradeFigures is one host's upgrade in one round: its servers' outage as the sampler
// saw it (the first to the last round that saw it down, to within 20 ms) and its host
// permit, from the permit's since to the test seeing it gone (to within 100 ms).
type upgradeFigures struct {
	round              int
	host               *host
	down, held         time.Duration
	total              time.Duration // the round's, from the plan's change to the last release
	install, pause     time.Duration // taken → reboot asked; reboot asked → agent started
	serving, releasing time.Duration // agent started → serving; serving → released
	killed             bool
}

// round writes driver to into the plan, drives the upgrade and logs each host's figures
// and the round's total; it returns the figures and the most servers down at once.
func (u *upgrade) round(round int, from, to string) ([]upgradeFigures, int) {
	t := u.t
	t.Helper()
	s := startSampler(u.hosts)
	start := time.Now()
	u.writePlan(to)
	recs := u.run(to, 90*time.Second, u.lease+time.Second, nil)
	total := time.Since(start)
	peak := s.check(t, 1)
	var figs []upgradeFigures
	for _, x := range u.hosts {
		r := recs[x.name]
		first, last := s.res.FirstDown[x.port], s.res.LastDown[x.port]
		f := upgradeFigures{round: round, host: x, down: last.Sub(first), held: r.released.Sub(r.taken), total: total,
			install: r.asked.Sub(r.taken), pause: r.up.Sub(r.asked), serving: last.Sub(r.up), releasing: r.released.Sub(last), killed: r.killed}
		// The permit is taken before the server stops and released after it serves again.
		if first.IsZero() || first.Before(r.taken) || last.After(r.released) {
			t.Errorf("round %d: %s's servers were down outside its host permit: down %s to %s, permit %s to %s", round, x.name,
				first.Format(time.StampMilli), last.Format(time.StampMilli), r.taken.Format(time.StampMilli), r.released.Format(time.StampMilli))
		}
		note := ""
		if f.killed {
			note = " (its agent SIGKILLed at its reboot request, started again in the same boot)"
		}
		t.Logf("round %d %s: servers down %s, host permit held %s: taken → reboot asked %s, reboot (the hook's pause) %s, agent started → serving %s, serving → released %s%s",
			round, x.name, sec(f.down), sec(f.held), sec(f.install), sec(f.pause), sec(f.serving), sec(f.releasing), note)
		figs = append(figs, f)
	}
	t.Logf("round %d: driver %s → %s on %d hosts in %s, at most %d host down at once", round, from, to, len(u.hosts), sec(total), peak)
	return figs, peak
}

// summary is the UPGRADE RESULT line: the range of each figure over the hosts whose agent
// was not killed, and of the rounds' totals.
func summary(all []upgradeFigures, rounds, hosts, peak int) string {
	var down, held, total []time.Duration
	for _, f := range all {
		if !f.killed {
			down, held = append(down, f.down), append(held, f.held)
		}
		if f.host == all[0].host {
			total = append(total, f.total)
		}
	}
	span := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "none"
		}
		lo, hi := slices.Min(ds), slices.Max(ds)
		return sec(lo) + "–" + sec(hi)
	}
	return fmt.Sprintf("rounds=%d hosts=%d most_down_at_once=%d servers_down=%s host_permit_held=%s fleet_total=%s",
		rounds, hosts, peak, span(down), span(held), span(total))
}

// sec is d in seconds to a tenth.
func sec(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

// A host that never comes back from its reboot keeps its host permit: the other host
// waits (serving its old driver, no reboot asked), agent status --fleet shows the holder
// rebooting, and agent fleet release frees the group; the other host then upgrades.
func TestHostThatNeverComesBackHoldsTheGroup(t *testing.T) {
	u := newUpgrade(t, 2)
	u.writePlan(driverOld)
	for _, x := range u.hosts {
		u.start(x)
	}
	u.converged("0.80", 2*time.Minute)
	u.writePlan(driverNew)
	var gone, other *host
	u.waitFor("a host asks for its reboot", time.Minute, func() bool {
		for i, x := range u.hosts {
			if u.rebootAsked(x) {
				gone, other = x, u.hosts[1-i]
				return true
			}
		}
		return false
	})
	u.goDown(gone)
	time.Sleep(3 * u.lease) // three of the other host's passes; the gone host's lease ends
	if u.loaded(other) != driverOld || !other.serves() || u.rebootAsked(other) {
		t.Fatalf("%s did not wait for %s's permit (driver %s, serves %v)", other.name, gone.name, u.loaded(other), other.serves())
	}
	if !strings.Contains(other.log(), "host group all: 1 of 1 host permits held: "+gone.name+" rebooting since") {
		t.Errorf("%s's log does not name the holder it waits for:\n%s", other.name, tail(other.log(), 2000))
	}
	if strings.Contains(other.log(), "waiting before the next try") {
		t.Errorf("%s backs off on a held host permit instead of waiting:\n%s", other.name, tail(other.log(), 2000))
	}
	doc, text := u.fleetStatus(other)
	if hp, _ := doc["fleet"].(map[string]any)["host_permits"].([]any); len(hp) != 1 || !strings.Contains(text, gone.name) {
		t.Fatalf("status --fleet does not show %s's held permit:\n%s", gone.name, text)
	}
	rel := exec.Command(u.agentBin, "fleet", "release", gone.name, u.planDir, "-var-file", other.varFile, "--reason", "board replaced")
	rel.Env = append(os.Environ(), "HOME="+u.work)
	if out, err := rel.CombinedOutput(); err != nil {
		t.Fatalf("agent fleet release %s: %v\n%s", gone.name, err, out)
	}
	recs := u.run(driverNew, 60*time.Second, u.lease+time.Second, map[string]bool{gone.name: true})
	if r := recs[other.name]; r.released.IsZero() || u.loaded(other) != driverNew {
		t.Fatalf("%s did not upgrade once %s's permit was released: %+v", other.name, gone.name, r)
	}
}
