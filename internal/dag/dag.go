// Package dag holds the dependency graph of a plan: ordering, cycle detection and the
// parallel walk that apply uses.
//
// Nodes are resource addresses ("file.nouveau"). An edge "a depends on b" means b must be
// applied before a. The walk runs ready nodes concurrently up to a parallelism limit and,
// when a node fails, skips everything that depends on it and reports the root cause once
// (the model is Terraform's internal/dag walk).
package dag

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Graph is a set of nodes with "depends on" edges. The zero value is empty and ready to use.
// Node order is the order of Add, and every listing keeps it, so output is stable.
type Graph struct {
	order []string
	deps  map[string][]string // node -> the nodes it depends on
	index map[string]int
}

// Add adds a node; adding it again is a no-op.
func (g *Graph) Add(node string) {
	if g.index == nil {
		g.index = map[string]int{}
		g.deps = map[string][]string{}
	}
	if _, ok := g.index[node]; ok {
		return
	}
	g.index[node] = len(g.order)
	g.order = append(g.order, node)
}

// Depend records that node depends on dep. Both are added if missing.
func (g *Graph) Depend(node, dep string) {
	g.Add(node)
	g.Add(dep)
	if slices.Contains(g.deps[node], dep) {
		return
	}
	g.deps[node] = append(g.deps[node], dep)
}

// Nodes returns the nodes in insertion order.
func (g *Graph) Nodes() []string { return slices.Clone(g.order) }

// Has reports whether node is in the graph.
func (g *Graph) Has(node string) bool { _, ok := g.index[node]; return ok }

// Deps returns the direct dependencies of node, in the order they were recorded.
func (g *Graph) Deps(node string) []string { return slices.Clone(g.deps[node]) }

// Dependents returns every node that depends on node, directly or not, in insertion
// order (node itself not included).
func (g *Graph) Dependents(node string) []string {
	rev := map[string][]string{}
	for _, n := range g.order {
		for _, d := range g.deps[n] {
			rev[d] = append(rev[d], n)
		}
	}
	return g.inOrder(g.reach([]string{node}, func(n string) []string { return rev[n] }), node)
}

// Upstream returns every node that node depends on, directly or not, in insertion order
// (node itself not included).
func (g *Graph) Upstream(node string) []string {
	return g.inOrder(g.reach([]string{node}, func(n string) []string { return g.deps[n] }), node)
}

// reach is the set of nodes reachable from starts (included) along next.
func (g *Graph) reach(starts []string, next func(string) []string) map[string]bool {
	seen := map[string]bool{}
	queue := slices.Clone(starts)
	for _, n := range starts {
		seen[n] = true
	}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, n := range next(cur) {
			if !seen[n] {
				seen[n] = true
				queue = append(queue, n)
			}
		}
	}
	return seen
}

// inOrder lists the nodes of set in insertion order, without skip.
func (g *Graph) inOrder(set map[string]bool, skip string) []string {
	var out []string
	for _, n := range g.order {
		if set[n] && n != skip {
			out = append(out, n)
		}
	}
	return out
}

// Cycle returns one dependency cycle as a path that starts and ends on the same node
// (a, b, a), or nil when the graph is acyclic.
func (g *Graph) Cycle() []string {
	const (
		white = iota
		grey
		black
	)
	color := make(map[string]int, len(g.order))
	var stack []string
	var found []string
	var visit func(n string) bool
	visit = func(n string) bool {
		color[n] = grey
		stack = append(stack, n)
		for _, d := range g.deps[n] {
			switch color[d] {
			case grey:
				i := slices.Index(stack, d)
				found = append(slices.Clone(stack[i:]), d)
				return true
			case white:
				if visit(d) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[n] = black
		return false
	}
	for _, n := range g.order {
		if color[n] == white && visit(n) {
			return found
		}
	}
	return nil
}

// CycleError names a dependency cycle.
type CycleError struct{ Path []string }

func (e *CycleError) Error() string {
	return "dependency cycle: " + strings.Join(e.Path, " → ")
}

// Sort returns the nodes in dependency order (dependencies first); among nodes that are
// ready at the same time, insertion order wins. It fails with a *CycleError on a cycle.
func (g *Graph) Sort() ([]string, error) {
	if c := g.Cycle(); c != nil {
		return nil, &CycleError{Path: c}
	}
	done := make(map[string]bool, len(g.order))
	out := make([]string, 0, len(g.order))
	for len(out) < len(g.order) {
		for _, n := range g.order {
			if done[n] {
				continue
			}
			ready := true
			for _, d := range g.deps[n] {
				if !done[d] {
					ready = false
					break
				}
			}
			if ready {
				done[n] = true
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// Closure returns the subgraph made of the given nodes and everything they depend on,
// transitively (what `--target` acts on). Unknown nodes are an error.
func (g *Graph) Closure(nodes []string) (*Graph, error) {
	for _, n := range nodes {
		if !g.Has(n) {
			return nil, fmt.Errorf("%s is not in the plan", n)
		}
	}
	keep := g.reach(nodes, func(n string) []string { return g.deps[n] })
	sub := &Graph{}
	for _, n := range g.order {
		if !keep[n] {
			continue
		}
		sub.Add(n)
		for _, d := range g.deps[n] {
			sub.Depend(n, d)
		}
	}
	return sub, nil
}

// SkippedError is the result of a node that was not run because a node it depends on
// (directly or not) failed. Cause names that failed node, the root cause.
type SkippedError struct {
	Cause string
}

func (e *SkippedError) Error() string {
	return fmt.Sprintf("skipped: depends on %s, which failed", e.Cause)
}

// ErrNotRun marks nodes that the walk never reached because its context ended first.
var ErrNotRun = errors.New("not run: the walk was cancelled")

// Walk calls fn for every node, each only after all its dependencies returned nil, with at
// most parallelism calls at once (1 when parallelism < 1). A node whose dependency failed
// or was skipped is not called: its result is a *SkippedError naming the root cause. When
// ctx ends, nodes not yet started get ErrNotRun. Walk returns every node's result (nil for
// success). fn must honour ctx; a cycle is an error before anything runs.
func (g *Graph) Walk(ctx context.Context, parallelism int, fn func(ctx context.Context, node string) error) (map[string]error, error) {
	if c := g.Cycle(); c != nil {
		return nil, &CycleError{Path: c}
	}
	if parallelism < 1 {
		parallelism = 1
	}
	dependents := map[string][]string{}
	waiting := map[string]int{}
	for _, n := range g.order {
		waiting[n] = len(g.deps[n])
		for _, d := range g.deps[n] {
			dependents[d] = append(dependents[d], n)
		}
	}

	var (
		mu      sync.Mutex
		results = make(map[string]error, len(g.order))
		wg      sync.WaitGroup
		sem     = make(chan struct{}, parallelism)
	)
	// finish records a result and releases (or skips) the dependents. Called with mu held.
	var finish func(n string, err error)
	var start func(n string)
	finish = func(n string, err error) {
		results[n] = err
		for _, dep := range dependents[n] {
			if _, done := results[dep]; done {
				continue
			}
			if err != nil {
				cause := n
				var skip *SkippedError
				if errors.As(err, &skip) {
					cause = skip.Cause
				}
				if errors.Is(err, ErrNotRun) {
					finish(dep, ErrNotRun)
				} else {
					finish(dep, &SkippedError{Cause: cause})
				}
				continue
			}
			waiting[dep]--
			if waiting[dep] == 0 {
				start(dep)
			}
		}
	}
	start = func(n string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				mu.Lock()
				finish(n, ErrNotRun)
				mu.Unlock()
				return
			}
			var err error
			if ctx.Err() != nil {
				err = ErrNotRun
			} else {
				err = fn(ctx, n)
			}
			<-sem
			mu.Lock()
			finish(n, err)
			mu.Unlock()
		}()
	}
	mu.Lock()
	for _, n := range g.order {
		if waiting[n] == 0 {
			start(n)
		}
	}
	mu.Unlock()
	wg.Wait()
	return results, nil
}
