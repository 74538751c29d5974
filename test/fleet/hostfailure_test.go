package fleet_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// One host's driver install fails (the fake .run exits 1) with max_unavailable = 2:
// the host group stops fleet-wide, so neither other host starts although the limit
// leaves room; agent status --fleet names the host, the step and the quoted error, and
// exits 3; the loop's retries record the failure once. Once the installer is fixed the
// failed host resumes by itself, reboots, is verified and released, and the others
// upgrade after it.
func TestFailedInstallStopsTheHostGroup(t *testing.T) {
	u := newUpgrade(t, 3)
	u.max = 2
	u.writePlan(driverOld)
	for _, x := range u.hosts {
		u.start(x)
	}
	u.converged("0.80", 2*time.Minute)
	bad, others := u.hosts[0], u.hosts[1:]
	marker := filepath.Join(u.work, bad.name, "install-fails")
	writeFile(t, marker, "")
	// The others' agents are away while bad fails first (they come back below).
	for _, x := range others {
		x.kill()
	}
	u.writePlan(driverNew)
	failed := func() map[string]any {
		for _, p := range u.hostPermits() {
			key, val, _ := strings.Cut(p, " ")
			var hp map[string]any
			if strings.HasSuffix(key, "/holders/"+bad.name) && json.Unmarshal([]byte(val), &hp) == nil && hp["failure"] != nil {
				return hp
			}
		}
		return nil
	}
	u.waitFor(bad.name+"'s failed install recorded in its host permit", time.Minute, func() bool { return failed() != nil })
	first := failed()
	for _, x := range others {
		u.start(x)
	}
	stop := "host group all is stopped: " + bad.name + " failed at install: "
	u.waitFor("the other hosts refused with the failure named", time.Minute, func() bool {
		for _, x := range others {
			if !strings.Contains(x.log(), stop) {
				return false
			}
		}
		return true
	})
	// The loop tries bad's install again (backoff 5 s): the same failure, not rewritten.
	u.waitFor(bad.name+"'s install tried again", 30*time.Second, func() bool {
		return strings.Count(bad.log(), "installing the driver") >= 2 && strings.Count(bad.log(), "resource failed") >= 2
	})
	if again := failed(); again == nil || again["updated"] != first["updated"] || again["state"] != "failed" {
		t.Errorf("the same failure was written again: %v, first %v", again, first)
	}
	for _, x := range others {
		if ps := u.hostPermits(); len(ps) != 1 || u.loaded(x) != driverOld || u.rebootAsked(x) || !x.serves() {
			t.Fatalf("%s started although %s failed: permits %q, driver %s, serves %v", x.name, bad.name, ps, u.loaded(x), x.serves())
		}
	}
	doc, _ := u.fleetStatus(others[0])
	hp, _ := doc["fleet"].(map[string]any)["host_permits"].([]any)
	if len(hp) != 1 {
		t.Fatalf("status --fleet --json host permits: %v", hp)
	}
	f, _ := hp[0].(map[string]any)["failure"].(map[string]any)
	if hp[0].(map[string]any)["host"] != bad.name || f["step"] != "install" || !strings.Contains(f["error"].(string), "Unable to build the NVIDIA kernel module") {
		t.Fatalf("status --fleet --json does not show the failure: %v", hp[0])
	}
	cmd := exec.Command(u.agentBin, "status", "--fleet", u.planDir, "-var-file", others[0].varFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	for _, want := range []string{bad.name + " failed at install since ", "    error: installer ", "│ ERROR: Unable to build the NVIDIA kernel module.",
		"host group all is stopped: no other host starts until " + bad.name + " is verified"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status --fleet does not say %q:\n%s", want, out.String())
		}
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Errorf("status --fleet with a failed host: %v, want exit 3", err)
	}

	// Fixed: bad resumes on its own, the others follow once it is verified.
	if err := os.Remove(marker); err != nil {
		t.Fatal(err)
	}
	recs := u.run(driverNew, 2*time.Minute, u.lease+time.Second, nil)
	for _, x := range others {
		if r := recs[x.name]; r.asked.Before(recs[bad.name].released) {
			t.Errorf("%s asked for its reboot at %s, before %s was verified and released at %s", x.name,
				r.asked.Format(time.RFC3339Nano), bad.name, recs[bad.name].released.Format(time.RFC3339Nano))
		}
	}
	if ps := u.hostPermits(); len(ps) != 0 {
		t.Fatalf("host permits left: %q", ps)
	}
}
