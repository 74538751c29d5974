package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/plans"
)

// rolling is a test kind: a file holding a value, whose change is a restart that takes
// it down for the length of its Apply. The fleet counts how many are down at once.
type rollingConfig struct {
	Path  string `hcl:"path"`
	Value string `hcl:"value"`
	Fail  bool   `hcl:"fail,optional"` // the restart fails (the member stays down)
}

type rollingFleet struct {
	mu         sync.Mutex
	down, peak int
	applies    int
	events     []string // "<file> ok" or "<file> failed", as restarts end
}

type rolling struct {
	f   *rollingFleet
	cfg *rollingConfig
}

func (r *rolling) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	have, err := os.ReadFile(r.cfg.Path)
	switch {
	case err != nil:
		return (&agent.Diff{}).Add(agent.Added("value", r.cfg.Value).Because(agent.Creates, agent.ReasonMissing)), nil
	case string(have) != r.cfg.Value:
		return (&agent.Diff{}).Add(agent.Set("value", string(have), r.cfg.Value).Because(agent.Restarts, agent.ReasonIdentity)), nil
	}
	return agent.NoChange(), nil
}

func (r *rolling) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) error {
	r.f.mu.Lock()
	r.f.down++
	r.f.applies++
	r.f.peak = max(r.f.peak, r.f.down)
	r.f.mu.Unlock()
	defer func() { r.f.mu.Lock(); r.f.down--; r.f.mu.Unlock() }()
	select { // long enough for the other workers to try their own restarts meanwhile
	case <-time.After(100 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	name := filepath.Base(r.cfg.Path)
	if r.cfg.Fail {
		os.Remove(r.cfg.Path) // stopped, and the new generation did not come up
		r.f.mu.Lock()
		r.f.events = append(r.f.events, name+" failed")
		r.f.mu.Unlock()
		return fmt.Errorf("not ready: log says CUDA out of memory")
	}
	r.f.mu.Lock()
	r.f.events = append(r.f.events, name+" ok")
	r.f.mu.Unlock()
	return os.WriteFile(r.cfg.Path, []byte(r.cfg.Value), 0o644)
}

func rollingPlan(dir, value string, failing ...string) string {
	return rollingPlanOf(dir, 1, func(string) string { return value }, failing...)
}

// rollingPlanOf is three members a, b, c of group qwen, each with its own value.
func rollingPlanOf(dir string, maxU int, value func(member string) string, failing ...string) string {
	var b strings.Builder
	for _, n := range []string{"a", "b", "c"} {
		fail := ""
		if slices.Contains(failing, n) {
			fail = "  fail  = true\n"
		}
		fmt.Fprintf(&b, "rolling %q {\n  path  = %q\n  value = %q\n%s  rollout {\n    group           = \"qwen\"\n    max_unavailable = %d\n  }\n}\n",
			n, filepath.Join(dir, n), value(n), fail, maxU)
	}
	return b.String()
}

// startRolling runs the loop on the plan at dir/plan.hcl until the test ends.
func startRolling(t *testing.T, dir string, f *rollingFleet) *syncBuffer {
	t.Helper()
	planPath := filepath.Join(dir, "plan.hcl")
	kinds := []agent.Kind{agent.NewKind("rolling", func(r *plans.Resource, c *rollingConfig) (agent.Resource, hcl.Diagnostics) {
		return &rolling{f: f, cfg: c}, nil
	})}
	log := &syncBuffer{}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		done <- Run(ctx, Config{
			PlanPath: planPath,
			Load: func() (*plans.Plan, hcl.Diagnostics) {
				return plans.Load(planPath, plans.Options{Schemas: agent.Schemas(kinds)})
			},
			Kinds:      kinds,
			StateDir:   filepath.Join(dir, "state"),
			Interval:   time.Hour,
			Listen:     "127.0.0.1:0",
			Log:        slog.New(slog.NewTextHandler(log, nil)),
			Ready:      func(addr string) { ready <- addr },
			Engine:     agent.Options{Parallelism: 4},
			StopGrace:  time.Second,
			BackoffMin: 20 * time.Millisecond,
			BackoffMax: 100 * time.Millisecond,
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run ended at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the endpoint did not come up")
	}
	return log
}

func writePlan(t *testing.T, dir, src string) {
	t.Helper()
	p := filepath.Join(dir, "plan.hcl")
	if err := os.WriteFile(p+".tmp", []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
}

func allAt(dir, v string) func() bool {
	return func() bool {
		for _, n := range []string{"a", "b", "c"} {
			if b, _ := os.ReadFile(filepath.Join(dir, n)); string(b) != v {
				return false
			}
		}
		return true
	}
}

// TestLoopObeysRolloutLimit: `agent run`'s workers go through the same group permits as
// apply: a plan change that restarts three members of a group restarts them one at a
// time, though four workers could run them at once, and none of them fails or backs off.
func TestLoopObeysRolloutLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writePlan(t, dir, rollingPlan(dir, "v1"))
	f := &rollingFleet{}
	log := startRolling(t, dir, f)
	waitFor(t, "the members created", allAt(dir, "v1"))
	f.mu.Lock()
	f.peak, f.applies = 0, 0 // creating them disrupted nothing that served
	f.mu.Unlock()

	writePlan(t, dir, rollingPlan(dir, "v2"))
	waitFor(t, "the members restarted on v2", allAt(dir, "v2"))
	waitFor(t, "the rollout recorded done", func() bool {
		_, err := os.Stat(filepath.Join(dir, "state", "rollouts.json"))
		return os.IsNotExist(err)
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peak != 1 || f.applies != 3 {
		t.Errorf("%d restarts, at most %d at once; want 3, one at a time\n%s", f.applies, f.peak, log.String())
	}
	if strings.Contains(log.String(), "resource failed") {
		t.Errorf("a member waiting for its group was counted as a failure:\n%s", log.String())
	}
	if !strings.Contains(log.String(), "waiting for its rollout group") {
		t.Errorf("no member waited for its group: the test proved nothing\n%s", log.String())
	}
}

// TestLoopStopsRolloutAtFailure: in `agent run` too, a member whose restart fails stops
// its group's rollout, whatever room max_unavailable leaves: it is retried (with backoff)
// and nothing else in the group is disrupted meanwhile; once it is fixed, the rollout goes
// on.
func TestLoopStopsRolloutAtFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	v := func(b, others string) func(string) string {
		return func(n string) string {
			if n == "b" {
				return b
			}
			return others
		}
	}
	writePlan(t, dir, rollingPlanOf(dir, 2, v("v1", "v1")))
	f := &rollingFleet{}
	log := startRolling(t, dir, f)
	waitFor(t, "the members created", allAt(dir, "v1"))
	failures := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return strings.Count(strings.Join(f.events, ","), "b failed")
	}

	// b's change fails; then a and c get one too, while b keeps failing.
	writePlan(t, dir, rollingPlanOf(dir, 2, v("v2", "v1"), "b"))
	waitFor(t, "member b failed", func() bool { return failures() >= 1 })
	f.mu.Lock()
	f.events = nil
	f.mu.Unlock()
	writePlan(t, dir, rollingPlanOf(dir, 2, v("v2", "v2"), "b"))
	waitFor(t, "member b retried under the new plan", func() bool { return failures() >= 3 })
	waitFor(t, "a and c held by b's failure", func() bool {
		return strings.Count(log.String(), "rollout qwen stopped: rolling.b failed") >= 2
	})
	f.mu.Lock()
	events := slices.Clone(f.events)
	f.mu.Unlock()
	for _, e := range events {
		if e != "b failed" {
			t.Errorf("%s while b was failing: the rollout did not stop (events %v)", e, events)
		}
	}

	writePlan(t, dir, rollingPlanOf(dir, 2, v("v2", "v2")))
	waitFor(t, "the rollout finished after the fix", allAt(dir, "v2"))
}
