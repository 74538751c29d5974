// Package restest is the path the resource kinds' tests drive their kinds through: the
// real plan loader and engine, as the agent does. Only tests import it.
package restest

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// LoadPlan loads src as dir/plan.hcl with the schemas of kinds and the given -var
// values, failing the test on any diagnostic.
func LoadPlan(t testing.TB, dir, src string, kinds []agent.Kind, vars ...string) *plans.Plan {
	t.Helper()
	p, diags := plans.LoadSources(dir, []plans.Source{{Name: filepath.Join(dir, "plan.hcl"), Data: []byte(src)}},
		plans.Options{Schemas: agent.Schemas(kinds), Vars: vars})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	return p
}

// OpenStore opens the state store at dir, failing the test on an error.
func OpenStore(t testing.TB, dir string) *state.Store {
	t.Helper()
	store, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// Engine is a fresh engine for src over store, as a new agent process would start
// one: each call observes the host anew.
func Engine(t testing.TB, dir, src string, kinds []agent.Kind, store *state.Store, opts agent.Options, vars ...string) *agent.Engine {
	t.Helper()
	e, err := agent.New(LoadPlan(t, dir, src, kinds, vars...), kinds, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// BindPlan loads src and binds it with kinds, for the tests of a kind's validation: the
// diagnostics are the loader's when it failed, else Bind's.
func BindPlan(src string, kinds []agent.Kind) (map[string]agent.Resource, hcl.Diagnostics) {
	p, diags := plans.LoadSources("/plans", []plans.Source{{Name: "/plans/plan.hcl", Data: []byte(src)}},
		plans.Options{Schemas: agent.Schemas(kinds)})
	if diags.HasErrors() {
		return nil, diags
	}
	return agent.Bind(p, kinds)
}

// InDir is a fresh engine for src (plan.hcl in dir, with var.root = dir) over the state
// in dir/.state, as a new agent process would start one.
func InDir(t testing.TB, dir, src string, kinds []agent.Kind) *agent.Engine {
	t.Helper()
	return Engine(t, dir, src, kinds, OpenStore(t, filepath.Join(dir, ".state")), agent.Options{}, "root="+dir)
}

// CheckWritesNothing binds src and runs addr's Check with its record read-only, failing
// the test on an error of the Check (a write is one) or on any change under the state
// directory.
func CheckWritesNothing(t *testing.T, dir, src string, kinds []agent.Kind, store *state.Store, addr string, vars ...string) *agent.Diff {
	t.Helper()
	p := LoadPlan(t, dir, src, kinds, vars...)
	res, diags := agent.Bind(p, kinds)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	before := StateFiles(t, store.Dir())
	env := &agent.Env{Addr: addr, State: store.For(addr).ReadOnly(), Log: slog.New(slog.DiscardHandler), Plan: p, Now: time.Now}
	d, err := res[addr].Check(t.Context(), env)
	if err != nil {
		t.Fatalf("%s: check: %v", addr, err)
	}
	if after := StateFiles(t, store.Dir()); !maps.Equal(before, after) {
		t.Errorf("%s: its check changed the state directory:\nbefore %v\nafter  %v", addr, before, after)
	}
	return d
}

// StateFiles is every file under dir with its mode, time and content digest.
func StateFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		sum := ""
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum = fmt.Sprintf("%x", sha256.Sum256(data))
		}
		out[strings.TrimPrefix(p, dir)] = fmt.Sprintf("%v %d %s", info.Mode(), info.ModTime().UnixNano(), sum)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// RecordOf is d's record update as T; false when d has none, or another.
func RecordOf[T any](d *agent.Diff) (T, bool) {
	var zero T
	if d == nil || d.Record == nil {
		return zero, false
	}
	v, ok := d.Record.Value.(T)
	return v, ok
}

// AsNobody runs argv as the user nobody with stdin, as another local user would.
func AsNobody(t *testing.T, stdin string, argv ...string) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"}, argv...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as nobody: %v: %v\n%s", argv, err, out)
	}
}

// ReachableDir is a root-owned 0755 directory right under the sticky /tmp: nobody can
// reach what a test puts in it (t.TempDir's parent is 0700), and it is trusted.
func ReachableDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the trust tests prove what a root agent refuses; run them as root (CI does)")
	}
	d, err := os.MkdirTemp("", "agent-trust-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// FakeGPUs is a gpu.Observer that reports fixed GPUs.
type FakeGPUs struct{ Info gpu.Info }

func (f FakeGPUs) Observe(context.Context) (gpu.Info, error) { return f.Info, nil }

// A6000 is what the missing-GPU error should list: a host with one RTX A6000.
var A6000 = FakeGPUs{gpu.Info{State: gpu.StateOK, Source: gpu.SourceNVML, DriverVersion: "580.95.05",
	GPUs: []gpu.Device{{Index: 0, Name: "NVIDIA RTX A6000", PCIBusID: "00000000:01:00.0"}}}}

// WaitingParallel raises -test.parallel to n when the command line did not set it and
// go test's default (GOMAXPROCS) is lower.
func WaitingParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set && runtime.GOMAXPROCS(0) < n {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}

// QuietWatch starts the engine's watch of addr and requires it to stay quiet for two
// member polls (its member answers); returned then requires it to return, without an
// error, within two polls and 5 s of offline, when the cluster marked the member
// Offline. The watch ends with the test.
func QuietWatch(t *testing.T, e *agent.Engine, addr string) (returned func(offline time.Time)) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	watched := make(chan error, 1)
	go func() { watched <- e.Watch(ctx, addr) }()
	select {
	case err := <-watched:
		t.Fatalf("the watch ended before the member hung: %v", err)
	case <-time.After(2 * resources.MemberWatchEvery):
	}
	return func(offline time.Time) {
		t.Helper()
		within := 2*resources.MemberWatchEvery + 5*time.Second
		select {
		case err := <-watched:
			if err != nil {
				t.Errorf("the watch: %v", err)
			}
			t.Logf("the watch returned %s after the cluster marked the member Offline", time.Since(offline).Round(time.Millisecond))
		case <-time.After(time.Until(offline.Add(within))):
			t.Errorf("the watch did not return within %s of the cluster marking the member Offline", within)
		}
	}
}

// Field is the text of st's field name ("" when it has none).
func Field(st *agent.Status, name string) string {
	for _, f := range st.Fields {
		if f.Name == name {
			return f.Text
		}
	}
	return ""
}

// WantErr fails the test unless err is an error that says every one of parts.
func WantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one with %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error lacks %q:\n%v", p, err)
		}
	}
}

// WaitingTests is how many of a package's parallel tests run at once unless
// -parallel says otherwise. They mostly wait (fake servers starting, ready.settle, stop
// timeouts, incusd and cluster round trips, members going offline) and little of it is
// CPU: on a 2-core machine the package used 0.6 of a core at go test's default of
// GOMAXPROCS (2) and took 275 s; at 4, 203 s with no test slower by more than noise; at 8,
// 183 s but the incusd tests stretched to 1.5× (the daemons themselves get busy). The server and
// container packages are the suite's critical path, so they take 4.
const WaitingTests = 4

// RemoveInstance deletes the instance name, stopping it first.
func RemoveInstance(t *testing.T, c *incus.Client, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	inst, _, err := c.GetInstance(ctx, name)
	if err != nil {
		return
	}
	if inst.StatusCode != incus.StatusStopped {
		_ = c.Kill(ctx, name)
	}
	if err := c.DeleteInstance(ctx, name); err != nil && !incus.IsNotFound(err) {
		t.Errorf("remove instance %s: %v", name, err)
	}
}

// StepOf returns the step of addr in rep.
func StepOf(t *testing.T, rep *agent.Report, addr string) *agent.Step {
	t.Helper()
	for _, st := range rep.Steps {
		if st.Addr == addr {
			return st
		}
	}
	t.Fatalf("no step %s in %d steps", addr, len(rep.Steps))
	return nil
}
