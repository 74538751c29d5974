package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/coord/etcdtest"
)

// A host that never came back holds its host permit: status --fleet shows it, and an
// operator's agent fleet release frees it, logged in etcd with who and when.
func TestFleetReleaseAndStatus(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	dir := t.TempDir()
	plan := filepath.Join(dir, "plan.hcl")
	src := fmt.Sprintf("agent {\n  coordination {\n    etcd = [%q]\n    prefix = \"/agent/cli\"\n    lease = \"2s\"\n    host_disruptions {\n      group = \"gpu-hosts\"\n    }\n  }\n}\n", cl.Endpoints()[0])
	if err := os.WriteFile(plan, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	kpro6, err := coord.Open(coord.Config{Endpoints: cl.Endpoints(), Prefix: "/agent/cli", Lease: 2 * time.Second, Host: "kpro6"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if _, _, _, err := kpro6.LeaseState(); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := kpro6.TakeHost(ctx, coord.HostRequest{Group: "gpu-hosts", Max: 1, Cause: "driver", Detail: "driver 580.95.05 → 590.48.01", BootID: "b1"}); err != nil {
		t.Fatal(err)
	}
	if err := kpro6.UpdateHost(ctx, "gpu-hosts", func(p *coord.HostPermit) { p.State = coord.HostRebooting }); err != nil {
		t.Fatal(err)
	}
	kpro6.Abandon() // rebooted, never back

	run := func(args ...string) (int, string, string) {
		var out, errs strings.Builder
		code := Main(args, &out, &errs)
		return code, out.String(), errs.String()
	}
	code, out, _ := run("status", "--fleet", plan)
	if code != ExitDegraded || !strings.Contains(out, "Hosts under disruption:\n  kpro6 rebooting since ") ||
		!strings.Contains(out, "(driver 580.95.05 → 590.48.01), permit held ") {
		t.Fatalf("status --fleet: exit %d\n%s", code, out)
	}
	code, _, errs := run("fleet", "release", "kpro7", plan)
	if code != ExitError || !strings.Contains(errs, "host kpro7 holds no host permit; held by: kpro6 in gpu-hosts") {
		t.Errorf("release of a host without a permit: exit %d: %s", code, errs)
	}
	code, out, errs = run("fleet", "release", "kpro6", plan, "--reason", "board replaced")
	if code != ExitOK || !strings.Contains(out, "Released kpro6's host permit in group gpu-hosts") || !strings.Contains(out, "by "+operator()) {
		t.Fatalf("fleet release: exit %d\n%s%s", code, out, errs)
	}
	c, err := coord.Open(coord.Config{Endpoints: cl.Endpoints(), Prefix: "/agent/cli", Host: "reader", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log, err := c.HostReleases(ctx)
	if err != nil || len(log) != 1 || log[0].By != operator() || log[0].Reason != "board replaced" || log[0].Permit.Host != "kpro6" {
		t.Fatalf("the release logged in etcd: %+v, %v", log, err)
	}
	if code, out, _ := run("status", "--fleet", plan); strings.Contains(out, "under disruption") {
		t.Errorf("status --fleet after the release: exit %d\n%s", code, out)
	}
}
