package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/agent-dev/agent/docs/schema"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/coord/etcdtest"
	"github.com/agent-dev/agent/internal/testbin"
)

const prefix = "/agent/fleet-test"

// harness is a fleet on one machine: an etcd (one or three members), and per host an
// `agent run` with its own state directory, fake SGLang server, metrics port and var
// file, all on one shared plan directory. Each agent reaches etcd through its own TCP
// proxies on loopback, which the test can pause (a partition: bytes stop flowing, the
// connections stay open).
type harness struct {
	t                 *testing.T
	work, planDir     string
	agentBin, fakeBin string
	etcd              *etcdtest.Cluster
	cli               *clientv3.Client
	hosts             []*host
	lease             time.Duration
	lastWhy           string
	settle            string
	nsMount           string // where each host's directory is mounted in its namespaces ("" none: hostNamespaces)
}

type host struct {
	name         string
	state, logs  string
	varFile      string
	port, listen int
	proxies      []*proxy
	logFile      string
	env          []string // added to its agent's environment (AGENT_HOST_ROOT)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// newHarness starts etcd with members members and writes the plan and var files of n
// hosts; start launches their agents.
func newHarness(t *testing.T, members, n int, lease time.Duration, settle string) *harness {
	t.Helper()
	testbin.Long(t, "runs etcd, three agents and three servers")
	h := &harness{t: t, work: t.TempDir(), lease: lease, settle: settle}
	h.etcd = etcdtest.Start(t, members, etcdtest.Options{})
	h.agentBin, h.fakeBin = testbin.Agent(t), testbin.FakeSGLang(t)
	h.planDir = filepath.Join(h.work, "plan")
	if err := os.MkdirAll(h.planDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The observer reconnects as fast as the agents do (gRPC's default backoff would
	// see etcd's return seconds late).
	cli, err := clientv3.New(clientv3.Config{Endpoints: h.etcd.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, MaxDelay: coord.ReconnectMax}})}})
	if err != nil {
		t.Fatal(err)
	}
	h.cli = cli
	t.Cleanup(func() { cli.Close() })
	t.Cleanup(func() {
		for _, x := range h.hosts {
			x.kill()
		}
		testbin.KillServers(h.work)
	})
	for i := range n {
		x := &host{name: fmt.Sprintf("h%d", i+1), port: testbin.FreePort(t), listen: testbin.FreePort(t)}
		x.state = filepath.Join(h.work, x.name, "state")
		x.logs = filepath.Join(h.work, x.name, "logs")
		x.logFile = filepath.Join(h.work, x.name, "agent.log")
		if keep := os.Getenv("FLEET_LOGS"); keep != "" { // bench/fleet.sh keeps them
			x.logFile = filepath.Join(keep, strings.ReplaceAll(t.Name(), "/", "_"), x.name+".log")
		}
		if err := os.MkdirAll(filepath.Dir(x.logFile), 0o700); err != nil {
			t.Fatal(err)
		}
		var eps []string
		for _, m := range h.etcd.Members {
			p := startProxy(t, strings.TrimPrefix(m.ClientURL, "http://"))
			x.proxies = append(x.proxies, p)
			eps = append(eps, "http://"+p.addr())
		}
		x.varFile = filepath.Join(h.work, x.name+".vars.hcl")
		quoted, _ := json.Marshal(eps)
		vars := fmt.Sprintf("host = %q\nport = %d\nlisten = \"127.0.0.1:%d\"\netcd = %s\nlogs = %q\nfake = %q\n",
			x.name, x.port, x.listen, quoted, x.logs, h.fakeBin)
		if err := os.WriteFile(x.varFile, []byte(vars), 0o644); err != nil {
			t.Fatal(err)
		}
		h.hosts = append(h.hosts, x)
	}
	return h
}

// writePlan writes the shared plan with mem-fraction-static = mem (the flag the rollouts
// change); the agents reload it on their own.
func (h *harness) writePlan(mem string) {
	h.t.Helper()
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
    name   = var.host
  }
}

`, prefix, int(h.lease/time.Second)) + testbin.GroupServer{Name: "qwen", Command: "var.fake", Port: "var.port",
		Mem: strconv.Quote(mem), Settle: h.settle, LogDir: "var.logs", Group: "qwen",
		// A second "loading weights" (/health 503), as SGLang's start has minutes of:
		// each restart is seen down by the sampler (sampler.check), not only its
		// instant of stop and listen, which was as short as two samples.
		Env: strconv.Quote("slow-start=1s")}.HCL()
	tmp := filepath.Join(h.work, "plan.hcl.tmp")
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.planDir, "main.hcl")); err != nil {
		h.t.Fatal(err)
	}
}

// start launches x's agent run.
func (h *harness) start(x *host) {
	h.t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	f, err := os.OpenFile(x.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		h.t.Fatal(err)
	}
	defer f.Close()
	cmd := h.command(x, "run", h.planDir, "-var-file", x.varFile, "--state-dir", h.hostPath(x, x.state))
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	x.cmd, x.exited = cmd, exited
}

// kill SIGKILLs x's agent (its servers live on, as after a crash).
func (x *host) kill() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.cmd == nil {
		return
	}
	_ = x.cmd.Process.Signal(syscall.SIGKILL)
	<-x.exited
	x.cmd = nil
}

// partition stops (or lets through again) everything between x's agent and etcd.
func (x *host) partition(on bool) {
	for _, p := range x.proxies {
		p.pause(on)
	}
}

func (x *host) log() string {
	b, _ := os.ReadFile(x.logFile)
	return string(b)
}

// serverPID is the PID x's state records for its server (0: none yet).
func (x *host) serverPID() int {
	var rec struct {
		PID int `json:"pid"`
	}
	b, err := os.ReadFile(filepath.Join(x.state, "resources", "server.qwen.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return 0
	}
	return rec.PID
}

// serves reports whether x's server answers /health with 200.
func (x *host) serves() bool {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(x.port) + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// runs reports whether x's recorded server runs with mem-fraction-static mem and serves.
func (x *host) runs(mem string) bool {
	pid := x.serverPID()
	if pid == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	for i, a := range args {
		if (a == "--mem-fraction-static" && i+1 < len(args) && args[i+1] == mem) || a == "--mem-fraction-static="+mem {
			return x.serves()
		}
	}
	return false
}

// permits reads the group's permits and stop from etcd.
func (h *harness) permits() (ps []coord.Permit, stopped bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := h.cli.Get(ctx, prefix+"/rollouts/qwen/", clientv3.WithPrefix())
	if err != nil {
		return nil, false, err
	}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if strings.HasSuffix(k, "/stopped") {
			stopped = true
		}
		if strings.Contains(k, "/permits/") {
			var p coord.Permit
			json.Unmarshal(kv.Value, &p)
			p.Revision = kv.CreateRevision
			ps = append(ps, p)
		}
	}
	return ps, stopped, nil
}

// waitFor polls cond every 50 ms until it holds, failing the test (with every agent's
// log tail) after limit.
func (h *harness) waitFor(what string, limit time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			for _, x := range h.hosts {
				h.t.Logf("--- %s's agent log (tail):\n%s", x.name, tail(x.log(), 3000))
			}
			h.t.Fatalf("%s: not after %s%s", what, limit, h.why())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deploy writes the plan with mem, starts every agent and waits until all serve it.
func (h *harness) deploy(mem string) {
	h.t.Helper()
	h.writePlan(mem)
	for _, x := range h.hosts {
		h.start(x)
	}
	h.converged(mem, 2*time.Minute)
}

// holder waits for a host that holds a "disrupting" permit and satisfies cond.
func (h *harness) holder(what string, cond func(*host) bool) *host {
	h.t.Helper()
	var holder *host
	h.waitFor(what, 2*time.Minute, func() bool {
		ps, _, _ := h.permits()
		for _, p := range ps {
			for _, x := range h.hosts {
				if x.name == p.Host && p.State == "disrupting" && cond(x) {
					holder = x
					return true
				}
			}
		}
		return false
	})
	return holder
}

// why is what the last failed convergence check saw.
func (h *harness) why() string {
	if h.lastWhy == "" {
		return ""
	}
	return " (" + h.lastWhy + ")"
}

// converged waits until every host serves mem and etcd holds no permit and no stop.
func (h *harness) converged(mem string, limit time.Duration) {
	h.t.Helper()
	h.waitFor("every host serves mem-fraction-static "+mem+" and no permit is left", limit, func() bool {
		for _, x := range h.hosts {
			if !x.runs(mem) {
				h.lastWhy = x.name + " does not serve it"
				return false
			}
		}
		ps, stopped, err := h.permits()
		h.lastWhy = fmt.Sprintf("permits %+v, stopped %v, %v", ps, stopped, err)
		return err == nil && len(ps) == 0 && !stopped
	})
	h.lastWhy = ""
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// sampler asks every server's /health every 20 ms and keeps the most down at once
// (testbin.WatchHealth, by host name here), and each server's PID when it started.
type sampler struct {
	hosts []*host
	pids  map[string]int
	w     *testbin.HealthWatch
	res   testbin.HealthResult // what it saw, once check stopped it
}

func startSampler(hosts []*host) *sampler {
	var ports []int
	pids := map[string]int{}
	for _, x := range hosts {
		ports = append(ports, x.port)
		pids[x.name] = x.serverPID()
	}
	return &sampler{hosts: hosts, pids: pids, w: testbin.WatchHealth(ports, 20*time.Millisecond)}
}

// check stops the sampler and fails the test if more than limit were down at once; it
// returns the most down at once. Every test here rolls a change across every host, so
// it also fails unless each host's server restarted (its recorded PID changed) and the
// sampler saw it down (no answer, or not 200) at least once: a sampler that saw
// nothing, or a rollout that restarted nothing, would pass the limit unnoticed. A
// restart cannot slip between two samples: each new server loads for a second
// (/health 503) before it serves.
func (s *sampler) check(t *testing.T, limit int) int {
	t.Helper()
	r := s.w.Stop()
	s.res = r
	names := map[int]string{}
	for _, x := range s.hosts {
		names[x.port] = x.name
	}
	downs := map[string]int{}
	for port, n := range r.Downs {
		downs[names[port]] = n
	}
	var at []string
	for _, port := range r.PeakDown {
		at = append(at, names[port])
	}
	peakAt := "none down"
	if r.Peak > 0 {
		peakAt = fmt.Sprintf("%v at %s", at, r.PeakTime.Format(time.StampMilli))
	}
	t.Logf("sampler: %d samples every 20 ms, down samples per host %v, most down at once %d (%s)", r.Samples, downs, r.Peak, peakAt)
	for _, x := range s.hosts {
		if pid := x.serverPID(); pid == s.pids[x.name] {
			t.Errorf("%s's server never restarted (pid %d throughout)", x.name, pid)
		} else if downs[x.name] == 0 {
			t.Errorf("%s's server restarted (pid %d → %d) but the sampler never saw it down in %d samples", x.name, s.pids[x.name], pid, r.Samples)
		}
	}
	if r.Peak > limit {
		t.Errorf("%d servers of the group were down at once (%s); max_unavailable is %d", r.Peak, peakAt, limit)
		for _, x := range s.hosts {
			t.Logf("--- %s's agent log from 6 s before to 2 s after:\n%s", x.name, around(x.log(), r.PeakTime))
		}
	}
	return r.Peak
}

// proxy forwards TCP to target; paused, it forwards nothing (new connections wait,
// bytes in flight wait), as a partition does.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{} // closed while traffic flows
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, open: make(chan struct{})}
	close(p.open)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *proxy) pause(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open: // flowing
		if on {
			p.open = make(chan struct{})
		}
	default:
		if !on {
			close(p.open)
		}
	}
}

func (p *proxy) serve(c net.Conn) {
	defer c.Close()
	<-p.gate()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				<-p.gate()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
}

// fleetStatus runs `agent status --fleet --json` on x's var file.
func (h *harness) fleetStatus(x *host) (map[string]any, string) {
	h.t.Helper()
	cmd := exec.Command(h.agentBin, "status", "--fleet", "--json", h.planDir, "-var-file", x.varFile)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = cmd.Run()
	var doc map[string]any
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		h.t.Fatalf("agent status --fleet --json: %v\n%s", err, out.String())
	}
	if err := schema.Validate(out.Bytes()); err != nil {
		h.t.Errorf("agent status --fleet --json does not match docs/schema: %v\n%s", err, out.String())
	}
	return doc, out.String()
}

// around is the log's lines from 6 s before t to 2 s after.
func around(log string, t time.Time) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		ts, _, ok := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if !ok || err != nil {
			continue
		}
		if at.After(t.Add(-6*time.Second)) && at.Before(t.Add(2*time.Second)) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
