package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
}

type rollingFleet struct {
	mu         sync.Mutex
	down, peak int
	applies    int
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
	return os.WriteFile(r.cfg.Path, []byte(r.cfg.Value), 0o644)
}

func rollingPlan(dir, value string) string {
	var b strings.Builder
	for _, n := range []string{"a", "b", "c"} {
		fmt.Fprintf(&b, "rolling %q {\n  path  = %q\n  value = %q\n  rollout {\n    group           = \"qwen\"\n    max_unavailable = 1\n  }\n}\n",
			n, filepath.Join(dir, n), value)
	}
	return b.String()
}

// TestLoopObeysRolloutLimit: `agent run`'s workers go through the same group permits as
// apply: a plan change that restarts three members of a group restarts them one at a
// time, though four workers could run them at once, and none of them fails or backs off.
func TestLoopObeysRolloutLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	planPath := filepath.Join(dir, "plan.hcl")
	write := func(src string) {
		if err := os.WriteFile(planPath+".tmp", []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(planPath+".tmp", planPath); err != nil {
			t.Fatal(err)
		}
	}
	write(rollingPlan(dir, "v1"))
	f := &rollingFleet{}
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
			Kinds:     kinds,
			StateDir:  filepath.Join(dir, "state"),
			Interval:  time.Hour,
			Listen:    "127.0.0.1:0",
			Log:       slog.New(slog.NewTextHandler(log, nil)),
			Ready:     func(addr string) { ready <- addr },
			Engine:    agent.Options{Parallelism: 4},
			StopGrace: time.Second,
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run ended at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the endpoint did not come up")
	}
	all := func(v string) func() bool {
		return func() bool {
			for _, n := range []string{"a", "b", "c"} {
				if b, _ := os.ReadFile(filepath.Join(dir, n)); string(b) != v {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "the members created", all("v1"))
	f.mu.Lock()
	f.peak, f.applies = 0, 0 // creating them disrupted nothing that served
	f.mu.Unlock()

	write(rollingPlan(dir, "v2"))
	waitFor(t, "the members restarted on v2", all("v2"))
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
