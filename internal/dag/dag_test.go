package dag

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// build makes a graph from "node:dep,dep" specs, in order.
func build(specs ...string) *Graph {
	g := &Graph{}
	for _, s := range specs {
		node, deps, _ := strings.Cut(s, ":")
		g.Add(node)
		for _, d := range strings.Split(deps, ",") {
			if d != "" {
				g.Depend(node, d)
			}
		}
	}
	return g
}

func TestSort(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		graph *Graph
		want  []string
		cycle []string
	}{
		{"empty", &Graph{}, []string{}, nil},
		{"independent keep insertion order", build("c", "a", "b"), []string{"c", "a", "b"}, nil},
		{"chain", build("server:container", "container:download", "download"), []string{"download", "container", "server"}, nil},
		{"diamond", build("d:b,c", "b:a", "c:a", "a"), []string{"a", "b", "c", "d"}, nil},
		{"self cycle", build("a:a"), nil, []string{"a", "a"}},
		{"three cycle", build("x", "a:b", "b:c", "c:a"), nil, []string{"a", "b", "c", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.graph.Sort()
			if tt.cycle != nil {
				var ce *CycleError
				if !errors.As(err, &ce) {
					t.Fatalf("Sort() error = %v, want a cycle", err)
				}
				if diff := cmp.Diff(tt.cycle, ce.Path); diff != "" {
					t.Errorf("cycle path (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Sort() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCycleErrorNamesPath(t *testing.T) {
	t.Parallel()
	_, err := build("server.a:container.b", "container.b:server.a").Sort()
	if err == nil || err.Error() != "dependency cycle: server.a → container.b → server.a" {
		t.Fatalf("got %v", err)
	}
}

func TestWalkOrderAndFailureSkipping(t *testing.T) {
	t.Parallel()
	// a ← b ← c, a ← d, e independent; b fails: c skipped with cause b, d and e run.
	g := build("a", "b:a", "c:b", "d:a", "e", "f:c,e")
	var mu sync.Mutex
	var ran []string
	results, err := g.Walk(context.Background(), 4, func(ctx context.Context, n string) error {
		mu.Lock()
		ran = append(ran, n)
		mu.Unlock()
		if n == "b" {
			return fmt.Errorf("boom")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ran)
	if diff := cmp.Diff([]string{"a", "b", "d", "e"}, ran); diff != "" {
		t.Errorf("ran (-want +got):\n%s", diff)
	}
	for _, n := range []string{"c", "f"} {
		var skip *SkippedError
		if !errors.As(results[n], &skip) || skip.Cause != "b" {
			t.Errorf("results[%s] = %v, want skipped with root cause b", n, results[n])
		}
	}
	for _, n := range []string{"a", "d", "e"} {
		if results[n] != nil {
			t.Errorf("results[%s] = %v, want nil", n, results[n])
		}
	}
}

func TestWalkRespectsDependencies(t *testing.T) {
	t.Parallel()
	g := build("download", "container", "server:download,container", "file", "smoke:server")
	var mu sync.Mutex
	done := map[string]bool{}
	_, err := g.Walk(context.Background(), 8, func(ctx context.Context, n string) error {
		mu.Lock()
		for _, d := range g.Deps(n) {
			if !done[d] {
				t.Errorf("%s started before its dependency %s finished", n, d)
			}
		}
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		done[n] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 5 {
		t.Errorf("ran %d nodes, want 5", len(done))
	}
}

func TestWalkParallelismLimit(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			g := &Graph{}
			for i := range 12 {
				g.Add(fmt.Sprint(i))
			}
			var cur, peak atomic.Int32
			release := make(chan struct{})
			go func() {
				// Let the walk saturate its slots before releasing, so the peak is reached.
				time.Sleep(20 * time.Millisecond)
				close(release)
			}()
			_, err := g.Walk(context.Background(), limit, func(ctx context.Context, n string) error {
				c := cur.Add(1)
				for {
					p := peak.Load()
					if c <= p || peak.CompareAndSwap(p, c) {
						break
					}
				}
				<-release
				cur.Add(-1)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := peak.Load(); got != int32(limit) {
				t.Errorf("peak concurrency = %d, want %d", got, limit)
			}
		})
	}
}

func TestWalkCancelled(t *testing.T) {
	t.Parallel()
	g := build("a", "b:a", "c:b")
	ctx, cancel := context.WithCancel(context.Background())
	results, err := g.Walk(ctx, 1, func(ctx context.Context, n string) error {
		cancel()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if results["a"] != nil {
		t.Errorf("a = %v, want nil (it ran)", results["a"])
	}
	for _, n := range []string{"b", "c"} {
		if !errors.Is(results[n], ErrNotRun) {
			t.Errorf("%s = %v, want ErrNotRun", n, results[n])
		}
	}
}

func TestWalkCycleRefused(t *testing.T) {
	t.Parallel()
	called := false
	_, err := build("a:b", "b:a").Walk(context.Background(), 2, func(context.Context, string) error {
		called = true
		return nil
	})
	var ce *CycleError
	if !errors.As(err, &ce) || called {
		t.Fatalf("err = %v, called = %v; want a cycle error before any call", err, called)
	}
}

func TestClosure(t *testing.T) {
	t.Parallel()
	g := build("download", "container", "server:download,container", "file", "other:file")
	sub, err := g.Closure([]string{"server"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"download", "container", "server"}, sub.Nodes()); diff != "" {
		t.Errorf("Closure (-want +got):\n%s", diff)
	}
	if _, err := g.Closure([]string{"nope"}); err == nil {
		t.Error("Closure of an unknown node succeeded")
	}
}

func TestDependentsAndUpstream(t *testing.T) {
	t.Parallel()
	// other is declared before what it depends on: the answer is still in insertion order.
	g := build("other:server", "download", "container", "server:download,container", "file", "smoke:server,file")
	for _, c := range []struct {
		node           string
		dependents, up []string
	}{
		{"container", []string{"other", "server", "smoke"}, nil},
		{"server", []string{"other", "smoke"}, []string{"download", "container"}},
		{"smoke", nil, []string{"server", "download", "container", "file"}},
		{"file", []string{"smoke"}, nil},
	} {
		if diff := cmp.Diff(c.dependents, g.Dependents(c.node)); diff != "" {
			t.Errorf("Dependents(%s) (-want +got):\n%s", c.node, diff)
		}
		if diff := cmp.Diff(c.up, g.Upstream(c.node)); diff != "" {
			t.Errorf("Upstream(%s) (-want +got):\n%s", c.node, diff)
		}
	}
}
