package fleet_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// agentCmd runs `agent ARGS... PLAN -var-file --state-dir` as x, and returns its exit
// code and combined output.
func (h *harness) agentCmd(x *host, args ...string) (int, string) {
	h.t.Helper()
	code, stdout, stderr := h.agentOut(x, args...)
	return code, stdout + stderr
}

// agentOut is agentCmd with stdout and stderr apart (--json: stdout is the document).
func (h *harness) agentOut(x *host, args ...string) (code int, stdout, stderr string) {
	h.t.Helper()
	cmd := h.agentExec(x, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		h.t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

// agentExec is the command `agent ARGS... PLAN -var-file --state-dir` as x (its
// environment: AGENT_HOST_ROOT and the reboot hook, and its namespaces, under newUpgrade).
func (h *harness) agentExec(x *host, args ...string) *exec.Cmd {
	return h.command(x, append(args, h.planDir, "-var-file", x.varFile, "--state-dir", h.hostPath(x, x.state))...)
}

// hostPermits reads the host permits' keys from etcd.
func (h *harness) hostPermits() []string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := h.cli.Get(ctx, prefix+"/rollouts/@hosts/", clientv3.WithPrefix())
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/holders/") {
			out = append(out, string(kv.Key)+" "+string(kv.Value))
		}
	}
	return out
}

// agent drain under agent run: the drain takes the host group's one permit and stops the
// host's server (verified), agent run keeps it down, the other host's drain is refused
// with the holder named, and agent drain --undo relaunches it and releases the permit.
func TestDrainHoldsTheHostPermit(t *testing.T) {
	h := newHarness(t, 1, 2, 2*time.Second, "1s")
	h.hostNamespaces() // each host a machine of its own (nshost_test.go)
	h.deploy("0.80")
	h1, h2 := h.hosts[0], h.hosts[1]

	code, out := h.agentCmd(h1, "drain", "--reason", "replace GPU 3")
	if code != 0 || !strings.Contains(out, "Drained: 1 servers stopped and verified gone (server.qwen). This host holds a host permit of group all.") {
		t.Fatalf("drain h1: exit %d\n%s", code, out)
	}
	if h1.serves() {
		t.Fatal("h1's server serves after the drain")
	}
	if ps := h.hostPermits(); len(ps) != 1 || !strings.Contains(ps[0], "/all/holders/h1 ") || !strings.Contains(ps[0], `"state":"drained"`) {
		t.Fatalf("host permits in etcd: %q", ps)
	}
	// agent run does not relaunch it (three passes of 2 s).
	time.Sleep(7 * time.Second)
	if h1.serves() {
		t.Fatalf("agent run relaunched a drained server:\n%s", tail(h1.log(), 2000))
	}
	if !strings.Contains(h1.log(), "host drained by ") {
		t.Errorf("agent run's log does not say why it keeps server.qwen down:\n%s", tail(h1.log(), 2000))
	}
	// The other host: refused, h1 named.
	code, out = h.agentCmd(h2, "drain")
	if code != 1 || !strings.Contains(out, "refused: host group all: 1 of 1 host permits held: h1 drained since") ||
		!strings.Contains(out, "replace GPU 3") || !h2.serves() {
		t.Fatalf("drain h2 while h1 is drained: exit %d\n%s", code, out)
	}
	doc, text := h.fleetStatus(h1)
	if hp, _ := doc["fleet"].(map[string]any)["host_permits"].([]any); len(hp) != 1 {
		t.Errorf("status --fleet does not show h1's host permit:\n%s", text)
	}

	code, out = h.agentCmd(h1, "drain", "--undo")
	if code != 0 || !strings.Contains(out, "Undrained: 1 servers serve again.") || !h1.serves() {
		t.Fatalf("drain --undo h1: exit %d\n%s", code, out)
	}
	if ps := h.hostPermits(); len(ps) != 0 {
		t.Fatalf("h1's permit after its undo: %q", ps)
	}
	code, out = h.agentCmd(h2, "drain")
	if code != 0 || h2.serves() {
		t.Fatalf("drain h2 once h1 released: exit %d\n%s", code, out)
	}
	if code, out = h.agentCmd(h2, "drain", "--undo"); code != 0 || !h2.serves() {
		t.Fatalf("drain --undo h2: exit %d\n%s", code, out)
	}
	h.converged("0.80", time.Minute)
}

// agent drain --undo relaunches servers, so it holds the host permit too: its own
// drain's, or a free one taken again when an operator freed it meanwhile. While other
// hosts fill the group it is refused with the holder named and the fix, the host stays
// drained (its drain record kept, agent run relaunching nothing), and it goes once the
// holder released its permit.
func TestDrainUndoRefusedWhileTheGroupIsFull(t *testing.T) {
	h := newHarness(t, 1, 2, 2*time.Second, "1s")
	h.hostNamespaces() // each host a machine of its own (nshost_test.go)
	h.deploy("0.80")
	h1, h2 := h.hosts[0], h.hosts[1]
	if code, out := h.agentCmd(h1, "drain", "--reason", "replace GPU 3"); code != 0 || h1.serves() {
		t.Fatalf("drain h1: exit %d\n%s", code, out)
	}
	// An operator frees h1's permit (its board is out for repair), and h2 drains.
	rel := exec.Command(h.agentBin, "fleet", "release", "h1", h.planDir, "-var-file", h2.varFile, "--reason", "board out for repair")
	rel.Env = append(os.Environ(), "HOME="+h.work)
	if out, err := rel.CombinedOutput(); err != nil {
		t.Fatalf("agent fleet release h1: %v\n%s", err, out)
	}
	if code, out := h.agentCmd(h2, "drain", "--reason", "reseat the NVLink bridge"); code != 0 || h2.serves() {
		t.Fatalf("drain h2 once h1's permit was freed: exit %d\n%s", code, out)
	}

	code, out := h.agentCmd(h1, "drain", "--undo")
	if code != 1 || !strings.Contains(out, "refused: host group all: 1 of 1 host permits held: h2 drained since") ||
		!strings.Contains(out, "reseat the NVLink bridge") || !strings.Contains(out, "the host stays drained") ||
		!strings.Contains(out, "agent fleet release HOST PLAN") {
		t.Fatalf("drain --undo h1 while h2 holds the group's permit: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(filepath.Join(h1.state, "drained.json")); err != nil {
		t.Fatalf("the refused undo removed h1's drain record: %v", err)
	}
	time.Sleep(5 * time.Second) // two of agent run's passes
	if h1.serves() {
		t.Fatalf("h1's server serves after a refused undo:\n%s", tail(h1.log(), 2000))
	}
	if ps := h.hostPermits(); len(ps) != 1 || !strings.Contains(ps[0], "/all/holders/h2 ") {
		t.Fatalf("host permits after the refused undo: %q", ps)
	}

	if code, out := h.agentCmd(h2, "drain", "--undo"); code != 0 || !h2.serves() {
		t.Fatalf("drain --undo h2: exit %d\n%s", code, out)
	}
	// The group has a permit free again: h1's undo takes it while it relaunches, and
	// releases it once its server serves.
	undo := h.agentStart(h1, "drain", "--undo")
	held := false
	for !undo.done() {
		for _, p := range h.hostPermits() {
			held = held || (strings.Contains(p, "/all/holders/h1 ") && strings.Contains(p, "agent drain --undo by "))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out := undo.out(); undo.code() != 0 || !strings.Contains(out, "Undrained: 1 servers serve again.") || !h1.serves() || !held {
		t.Fatalf("drain --undo h1 once the group has a permit free: exit %d, permit seen held %v\n%s", undo.code(), held, out)
	}
	if ps := h.hostPermits(); len(ps) != 0 {
		t.Fatalf("host permits left: %q", ps)
	}
	h.converged("0.80", time.Minute)
}

// Without coordination, agent drain stops the servers (verified) and keeps them down for
// apply; agent drain --undo relaunches them. No etcd is involved.
func TestDrainWithoutCoordination(t *testing.T) {
	testbin.Long(t, "runs the agent and a server")
	work := t.TempDir()
	t.Cleanup(func() { testbin.KillServers(work) })
	port := testbin.FreePort(t)
	plan := filepath.Join(work, "plan.hcl")
	src := testbin.GroupServer{Name: "qwen", Command: strconv.Quote(testbin.FakeSGLang(t)), Port: strconv.Itoa(port), Mem: `"0.80"`,
		Settle: "1s", LogDir: strconv.Quote(filepath.Join(work, "logs")), Group: "qwen"}.HCL()
	if err := os.WriteFile(plan, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	x := &host{port: port}
	run := func(args ...string) (int, string) {
		cmd := exec.Command(testbin.Agent(t), append(args, plan, "--state-dir", filepath.Join(work, "state"))...)
		cmd.Env = append(os.Environ(), "HOME="+work)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return code, string(out)
	}
	if code, out := run("apply"); code != 0 || !x.serves() {
		t.Fatalf("apply: exit %d\n%s", code, out)
	}
	if code, out := run("drain", "--reason", "reseat the NVLink bridge"); code != 0 || x.serves() || strings.Contains(out, "host permit") {
		t.Fatalf("drain: exit %d, serves %v\n%s", code, x.serves(), out)
	}
	if code, out := run("apply"); code != 1 || !strings.Contains(out, "host drained by ") || !strings.Contains(out, "reseat the NVLink bridge") || x.serves() {
		t.Fatalf("apply on a drained host: exit %d, serves %v\n%s", code, x.serves(), out)
	}
	if code, out := run("drain", "--undo"); code != 0 || !strings.Contains(out, "Undrained: 1 servers serve again.") || !x.serves() {
		t.Fatalf("drain --undo: exit %d, serves %v\n%s", code, x.serves(), out)
	}
	if code, out := run("plan"); code != 0 {
		t.Errorf("plan after the undo: exit %d\n%s", code, out)
	}
}

// hostFailure is the failure recorded in x's host permit, as JSON ("" none), x's being the
// only host permit held.
func (h *harness) hostFailure(x *host) string {
	h.t.Helper()
	ps := h.hostPermits()
	if len(ps) != 1 || !strings.Contains(ps[0], "/all/holders/"+x.name+" ") {
		h.t.Fatalf("host permits (want %s's alone): %q", x.name, ps)
	}
	_, f, _ := strings.Cut(ps[0], `"failure":`)
	return f
}

// A drain whose stop fails records the failure in its host permit, as a driver change's
// failed stop does: the host group stops fleet-wide (another host's drain is refused with
// the failure named, agent status --fleet shows it and exits 3). The drain retried, once
// the cause is gone (here h1's server record, unreadable, is put back), stops the server
// and clears its stop failure. An undo whose relaunch fails records the failed
// verification; once the cause is gone, the undo relaunches and releases the permit.
func TestDrainWhoseStopFailsStopsTheHostGroup(t *testing.T) {
	h := newHarness(t, 1, 2, 2*time.Second, "1s")
	h.hostNamespaces() // each host a machine of its own (nshost_test.go)
	h.writePlan("0.80")
	h1, h2 := h.hosts[0], h.hosts[1]
	for _, x := range h.hosts {
		if code, out := h.agentCmd(x, "apply"); code != 0 || !x.serves() {
			t.Fatalf("apply %s: exit %d\n%s", x.name, code, out)
		}
	}
	record := filepath.Join(h1.state, "resources", "server.qwen.json")
	good, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(record, []byte(`{"pid": `), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := h.agentCmd(h1, "drain", "--reason", "replace GPU 3")
	if code != 1 || !strings.Contains(out, "drained, but not every server stopped: ") || !h1.serves() {
		t.Fatalf("drain h1 with its server record unreadable: exit %d, serves %v\n%s", code, h1.serves(), out)
	}
	if f := h.hostFailure(h1); !strings.Contains(f, `"step":"stop"`) || !strings.Contains(f, "server.qwen") {
		t.Fatalf("h1's permit does not record the failed stop: %s", h.hostPermits()[0])
	}
	code, out = h.agentCmd(h2, "drain")
	if code != 1 || !strings.Contains(out, "host group all is stopped: h1 failed at stop") || !h2.serves() {
		t.Fatalf("drain h2 while h1's stop failed: exit %d\n%s", code, out)
	}
	cmd := exec.Command(h.agentBin, "status", "--fleet", h.planDir, "-var-file", h2.varFile)
	var st bytes.Buffer
	cmd.Stdout, cmd.Stderr = &st, &st
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || !strings.Contains(st.String(), "h1 failed at stop since ") {
		t.Errorf("status --fleet while h1's stop failed: %v\n%s", err, st.String())
	}

	if err := os.WriteFile(record, good, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = h.agentCmd(h1, "drain", "--reason", "replace GPU 3")
	if code != 0 || !strings.Contains(out, "Drained: 1 servers stopped and verified gone") || h1.serves() {
		t.Fatalf("drain h1 again: exit %d, serves %v\n%s", code, h1.serves(), out)
	}
	if f := h.hostFailure(h1); f != "" || !strings.Contains(h.hostPermits()[0], `"state":"drained"`) {
		t.Fatalf("h1's permit after its drain stopped the server: %s", h.hostPermits()[0])
	}

	// An undo whose relaunch fails (h1's port held by another process) fails the host's
	// verification: recorded, the group stays stopped; freed, the undo serves and releases.
	squat, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", h1.port))
	if err != nil {
		t.Fatal(err)
	}
	code, out = h.agentCmd(h1, "drain", "--undo")
	if code != 1 || !strings.Contains(out, "the servers do not all serve: the host keeps its host permit") || h1.serves() {
		t.Fatalf("drain --undo h1 with its port held: exit %d\n%s", code, out)
	}
	if f := h.hostFailure(h1); !strings.Contains(f, `"step":"verify"`) || !strings.Contains(f, "server.qwen: ") {
		t.Fatalf("h1's permit does not record its failed relaunch: %s", h.hostPermits()[0])
	}
	squat.Close()
	if code, out = h.agentCmd(h1, "drain", "--undo"); code != 0 || !h1.serves() {
		t.Fatalf("drain --undo h1: exit %d\n%s", code, out)
	}
	if ps := h.hostPermits(); len(ps) != 0 {
		t.Fatalf("h1's permit after its undo: %q", ps)
	}
}
