// Package restest is the path the resource kinds' tests drive their kinds through: the
// real plan loader and engine, as the agent does. Only tests import it.
package restest

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
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
