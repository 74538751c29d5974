// Package packaging holds what the Debian package ships besides the binary: the systemd
// unit, the example plan, the maintainer scripts and the Prometheus alerting rules. Its
// tests check the rules with promtool (scripts/build-deb.sh builds the package;
// test/service installs it under a real systemd).
package packaging

import (
	"os/exec"
	"testing"

	"github.com/agent-dev/agent/internal/testbin"
)

// promtoolHint installs promtool (Debian's prometheus package).
const promtoolHint = "sudo scripts/install-incus.sh (installs Debian's prometheus package, which brings promtool)"

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		testbin.Missing(t, "promtool not found", "install with: "+promtoolHint)
	}
	return p
}

// TestAlertRules checks the rules and runs their unit tests (agent.rules.test.yml): each
// alert fires when it should and stays quiet when it should not.
func TestAlertRules(t *testing.T) {
	p := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "agent.rules.yml"},
		{"test", "rules", "agent.rules.test.yml"},
	} {
		out, err := exec.Command(p, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
