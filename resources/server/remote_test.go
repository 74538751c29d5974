package server

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// TestServerInContainerOnRemoteMember: a server in a container on m2 that the agent
// reaches through the Incus API only (through m1's socket the runner decides so itself;
// through m2's, Machine.IncusRemote forces it: the test cluster's members share this host,
// where /proc would otherwise be used), with the assertions of the local
// path: a record written by the /proc path is still read as it was (no relaunch) and
// stopped, verified; the verified launch recorded in the container's own PID
// namespace; readiness, smoke test and status with its log; a kill inside noticed by
// the watch within seconds and relaunched; a server that ignores SIGTERM, with
// children in and out of its session, stopped with proof; a failed launch quoted from
// its own log inside; a pending launch found inside by its marker; a container restart
// that makes the recorded PID gone; adoption after lost state; an orphan stopped.
func TestServerInContainerOnRemoteMember(t *testing.T) {
	t.Parallel() // leaves the cluster whole (see incusCluster)
	c := incusCluster.Start(t)
	// Through m2's own socket, where the instance runs: the runner would use /proc, so
	// the test switch makes it work as through another member's.
	m2 := c.Member("m2")
	h, on := onMember2(t, c, m2.Socket, resources.Machine{GPU: restest.A6000, IncusRemote: true})
	engine := func(remote bool, vars ...string) *agent.Engine {
		return on(resources.Machine{GPU: restest.A6000, IncusRemote: remote}, vars...)
	}
	apply := func(vars ...string) *agent.Step {
		return h.step(engine(true, vars...).Apply(context.Background(), nil))
	}
	plan := func(vars ...string) *agent.Step { return h.step(engine(true, vars...).Plan(context.Background())) }
	ctx := context.Background()
	// The runner's own choice: remote through m1's socket, /proc through m2's.
	for sock, want := range map[*incus.Client]bool{c.Client: true, m2.Client: false} {
		r := &lifecycle.Incus{Client: sock, Instance: h.name}
		if remote, err := r.IsRemote(ctx); err != nil || remote != want {
			t.Errorf("IsRemote through %s = %v, %v; want %v", sock.Socket(), remote, err, want)
		}
	}
	// alive and marked look inside, as the agent does, independently of it.
	aliveInside := func(r serverRecord) bool {
		out := h.exec("sh", "-c", `read -r s </proc/$1/stat 2>/dev/null && echo "$s" || true`, "x", strconv.Itoa(r.PID))
		f := strings.Fields(out[strings.LastIndex(out, ")")+1:])
		return len(f) > 19 && f[19] == strconv.FormatUint(r.StartTicks, 10) && f[0] != "Z"
	}
	markedInside := func(marker string) []string {
		out := h.exec("sh", "-c", `for d in /proc/[0-9]*; do tr '\0' '\n' <$d/environ 2>/dev/null | grep -qxF -- "$1" && echo ${d#/proc/}; done; true`, "x", marker)
		return strings.Fields(out)
	}

	// A launch by the /proc path (a record of today's agent): read the same way by the
	// remote runner, left alone.
	if st := h.step(engine(false).Apply(ctx, nil)); st.Err != nil {
		t.Fatalf("apply by the /proc path: %v\n%s", st.Err, c.LogTail(15))
	}
	old := h.record()
	if old.PIDNS != "" || !alive(old.id()) {
		t.Fatalf("record of the /proc path = %+v", old)
	}
	if st := plan(); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("the remote runner's plan of a /proc record: %v %+v", st.Err, st.Diff)
	}

	// A flag change: the host-PID record stopped, verified; the launch recorded in the
	// container's namespace, by its PID there.
	mustOK(t, apply("mem=0.85"))
	first := h.record()
	if alive(old.id()) || len(markedInside(old.Marker)) > 0 {
		t.Errorf("generation %d survived its relaunch", old.Generation)
	}
	if first.Generation != 2 || first.PIDNS == "" || !strings.Contains(first.PIDNS, "/") ||
		first.PGID != first.PID || first.SID != first.PID || first.LogPath != "/var/log/agent/qwen.2.log" {
		t.Fatalf("record = %+v", first)
	}
	if argv := strings.Split(strings.TrimRight(h.exec("cat", "/proc/"+strconv.Itoa(first.PID)+"/cmdline"), "\x00"), "\x00"); !slices.Equal(argv, first.Argv) {
		t.Errorf("pid %d inside runs %q, want %q", first.PID, argv, first.Argv)
	}
	if !aliveInside(first) {
		t.Errorf("pid %d (start %d) is not alive inside", first.PID, first.StartTicks)
	}
	if st := plan("mem=0.85"); st.Err != nil || st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after the remote launch: %v %+v", st.Err, st.Diff)
	}
	st := h.step(engine(true, "mem=0.85").Status(ctx))
	if st.Err != nil || !st.Status.Healthy || st.Status.Member() != "m2" || fieldOf(st.Status, "generation") != "2" ||
		fieldOf(st.Status, "pid") != strconv.Itoa(first.PID) || !strings.Contains(fieldOf(st.Status, "smoke test"), "passed") ||
		strings.Contains(fieldOf(st.Status, "newest line"), "unreadable") || fieldOf(st.Status, "newest line") == "" {
		t.Fatalf("status: %v %+v", st.Err, st.Status)
	}

	// One look inside (an exec through the cluster), for the figures.
	look := time.Now()
	r := &lifecycle.Incus{Client: m2.Client, Instance: h.name, Remote: true}
	if ok, err := r.ProcsIn(context.Background(), first.PIDNS).Alive(context.Background(), first.id()); err != nil || !ok {
		t.Errorf("Alive(%v) inside = %v, %v", first.id(), ok, err)
	}
	t.Logf("one look inside took %s", time.Since(look).Round(time.Millisecond))

	// The watch notices a kill inside within seconds; the reconcile relaunches.
	eng := engine(true, "mem=0.85")
	watched := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { watched <- eng.Watch(wctx, "server.qwen") }()
	select {
	case err := <-watched:
		t.Fatalf("the watch returned while the server runs: %v", err)
	case <-time.After(2 * RemoteWatchEvery):
	}
	killed := time.Now()
	h.exec("kill", "-9", strconv.Itoa(first.PID))
	select {
	case err := <-watched:
		if err != nil {
			t.Fatalf("watch = %v", err)
		}
		d := time.Since(killed)
		if d > 5*time.Second {
			t.Errorf("the death was noticed after %s, want within a few seconds", d)
		}
		t.Logf("the death on the remote member was noticed after %s", d.Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not notice the death on the remote member")
	}
	if st := eng.Reconcile(ctx, "server.qwen"); st.Err != nil || !st.Applied || st.Diff.Action != agent.Restart {
		t.Fatalf("the reconcile after the death: %v %+v", st.Err, st.Diff)
	}
	second := h.record()
	if second.Generation != 3 || second.PIDNS != first.PIDNS || !aliveInside(second) {
		t.Fatalf("generation 3 = %+v", second)
	}

	// A server that ignores SIGTERM, with children in its group and one in a session of
	// its own: the relaunch stops every one of them inside, escalated and verified.
	faults := "faults=ignore-sigterm,children=2,setsid-child"
	mustOK(t, apply("mem=0.85", faults))
	third := h.record()
	if family := markedInside(third.Marker); third.Generation != 4 || len(family) < 4 {
		t.Fatalf("generation 4 = %+v with %d processes", third, len(family))
	}
	start := time.Now()
	mustOK(t, apply("mem=0.8", faults))
	if left := markedInside(third.Marker); len(left) > 0 {
		t.Errorf("processes of generation 4 survived its stop: %v", left)
	}
	if time.Since(start) < time.Second {
		t.Error("the stop did not wait for SIGTERM before SIGKILL")
	}
	if r := h.record(); r.Generation != 5 || !aliveInside(r) {
		t.Fatalf("generation 5 = %+v", r)
	}

	// An OOM at launch: the error quotes that generation's log, read through Incus.
	oom := apply("faults=oom", "revert=false") // the rolled-back case: TestServerInContainer
	if oom.Err == nil {
		t.Fatal("an OOM launch applied without error")
	}
	msg := oom.Err.Error()
	for _, want := range []string{"launch of generation 6 failed", "exited", "out of GPU memory", "CUDA out of memory",
		"/var/log/agent/qwen.6.log (in container " + h.name + ")"} {
		if !strings.Contains(msg, want) {
			t.Errorf("apply error lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "fired up") {
		t.Errorf("the error quotes another generation's lines:\n%s", msg)
	}
	if s := h.step(engine(true, "faults=oom", "revert=false").Status(ctx)); s.Err != nil || s.Status.Healthy || !strings.Contains(s.Status.Summary, "out of GPU memory") {
		t.Errorf("status after the OOM = %v %+v", s.Err, s.Status)
	}
	mustOK(t, apply())
	if r := h.record(); r.Generation != 7 || !aliveInside(r) {
		t.Fatalf("generation 7 = %+v", r)
	}
	// Logs beyond keep_logs are pruned inside; the current link points at generation 7.
	if got := strings.TrimSpace(h.exec("readlink", "/var/log/agent/qwen.log")); got != "qwen.7.log" {
		t.Errorf("qwen.log -> %q", got)
	}

	// An agent killed between the launch and its record left only the intent: the next
	// run finds the launch inside by its marker and records it in its namespace.
	seventh := h.record()
	intent := seventh
	intent.PID, intent.StartTicks, intent.PGID, intent.SID, intent.PIDNS = 0, 0, 0, 0, ""
	intent.LaunchedAt, intent.ReadyAt, intent.VerifiedAt = time.Time{}, time.Time{}, time.Time{}
	if err := h.store.Save("server.qwen", &serverRecord{Generation: 6, Pending: &intent}); err != nil {
		t.Fatal(err)
	}
	st = plan()
	if st.Err != nil {
		t.Fatalf("plan with a pending launch: %v", st.Err)
	}
	if r, ok := st.Diff.Record.Value.(*serverRecord); !ok || r.Pending != nil || r.id() != seventh.id() || r.PIDNS != seventh.PIDNS {
		t.Fatalf("the pending launch was recovered as %+v, want pid %d in %s", st.Diff.Record, seventh.PID, seventh.PIDNS)
	}
	if r := h.record(); r.Pending == nil {
		t.Fatalf("the plan wrote the record: %+v", r)
	}
	mustOK(t, apply())
	if r := h.record(); r.id() != seventh.id() || r.VerifiedAt.IsZero() {
		t.Fatalf("the recovered launch was not verified in place: %+v", r)
	}

	// The container restarts: its PID namespace is another, so the recorded PID is gone
	// whatever runs under that number now, and the next apply relaunches.
	if err := c.Client.Restart(ctx, h.name, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	h.exec("ip", "link", "set", "lo", "up")
	gone := func(d *agent.Diff) bool {
		return slices.ContainsFunc(d.Changes, func(c agent.Change) bool {
			return c.Attr == "process" && strings.Contains(fmt.Sprint(c.Old), "is gone")
		})
	}
	if st := plan(); st.Err != nil || st.Diff.Action != agent.Restart || !gone(st.Diff) {
		t.Fatalf("plan after the container restarted: %v %+v", st.Err, st.Diff)
	}
	mustOK(t, apply())
	if r := h.record(); r.Generation != 8 || r.PIDNS == seventh.PIDNS || !aliveInside(r) {
		t.Fatalf("after the container restart: %+v (namespace was %s)", r, seventh.PIDNS)
	}

	// State lost: the server running exactly the plan's command line is adopted, in its
	// namespace, not restarted; a flag change then stops it, verified, and relaunches.
	eighth := h.record()
	if err := h.store.Delete("server.qwen"); err != nil {
		t.Fatal(err)
	}
	if st := plan(); st.Err != nil || st.Diff.Action != agent.Adopt {
		t.Fatalf("plan with the state lost: %v %+v", st.Err, st.Diff)
	}
	mustOK(t, apply())
	if r := h.record(); !r.Adopted || r.id() != eighth.id() || r.PIDNS != eighth.PIDNS {
		t.Fatalf("adopted as %+v, want pid %d in %s", r, eighth.PID, eighth.PIDNS)
	}
	mustOK(t, apply("mem=0.85"))
	if r := h.record(); r.Generation != 9 || r.Adopted || aliveInside(eighth) || !aliveInside(r) || len(markedInside(eighth.Marker)) > 0 {
		t.Fatalf("after the relaunch of the adopted server: %+v", r)
	}

	// The server leaves the plan: the orphan is stopped inside, verified, and its record
	// removed.
	ninth := h.record()
	ctrOnly := strings.Replace(ctrSrvContainer, `image = "busybox"`, "image = \"busybox\"\n  target = \"m2\"", 1)
	vars := []string{"incus_socket=" + m2.Socket, "name=" + h.name, "hport=" + strconv.Itoa(h.hport), "port=" + strconv.Itoa(h.port)}
	rep := restest.Engine(t, h.dir, ctrOnly, kindsFor(resources.Machine{GPU: restest.A6000, IncusRemote: true}), h.store, agent.Options{StepTimeout: 2 * time.Minute, Orphans: agent.OrphansDelete, AllowDeleteAll: true}, vars...).Apply(ctx, nil)
	for _, st := range rep.Steps {
		if st.Err != nil {
			t.Fatalf("%s: %v", st.Addr, st.Err)
		}
	}
	if aliveInside(ninth) || len(markedInside(ninth.Marker)) > 0 {
		t.Errorf("the orphan survived its stop: %v", markedInside(ninth.Marker))
	}
	if ok, _ := h.store.Has("server.qwen"); ok {
		t.Error("the orphan's record is still there")
	}
}
