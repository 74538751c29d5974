package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/coord"
	"github.com/agent-dev/agent/internal/drain"
	"github.com/agent-dev/agent/internal/view"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// HostRequest is the host permit a disruption of this host asks for under plan p: in
// its coordination block's host group, counting every server of p's rollout groups as
// down in its group (a host disruption takes them all down). cause is "driver", "drain"
// or "reboot"; detail says more (the versions, a drain's reason); bootID is this boot's.
func HostRequest(p *plans.Plan, cause, detail, bootID string) coord.HostRequest {
	hd := p.Agent.Coordination.HostDisruptions
	req := coord.HostRequest{Group: hd.Group, Max: hd.MaxUnavailable, Cause: cause, Detail: detail, BootID: bootID,
		Members: map[string][]string{}, Slots: map[string]int{}}
	for _, g := range p.RolloutGroups() {
		req.Members[g.Name] = append([]string(nil), g.Members...)
		req.Slots[g.Name] = g.MaxUnavailable
	}
	return req
}

// FinishHost ends this host's disruption once it is over: when it holds a host permit in
// group that is not a drain (agent drain --undo ends those) and, if it recorded a reboot,
// it runs in another boot than the one it rebooted from, verify (the driver loaded,
// every server serving) is asked, and the permit released when it says yes. It reports
// whether a permit was released; a permit whose reboot has not happened yet (the agent
// restarted before it) is left to the reboot, and reported as pending.
func FinishHost(ctx context.Context, c *coord.Client, group, bootID string, verify func(context.Context, coord.HostPermit) error) (released bool, pending *coord.HostPermit, err error) {
	p, err := c.MyHostPermit(ctx, group)
	if err != nil || p == nil {
		return false, nil, err
	}
	switch {
	case p.Cause == "drain":
		return false, p, nil
	case p.RebootID != "" && p.RebootID == bootID:
		return false, p, nil
	}
	if p.State != coord.HostVerifying && p.State != coord.HostFailed {
		if err := c.UpdateHost(ctx, group, func(hp *coord.HostPermit) { hp.State = coord.HostVerifying }); err != nil {
			return false, p, err
		}
		p.State = coord.HostVerifying // as written: what a failure below names
	}
	if err := verify(ctx, *p); err != nil {
		var vf *VerifyFailure
		if errors.As(err, &vf) && recordVerify(p, bootID) {
			if _, ferr := c.FailHost(ctx, group, coord.StepVerify, vf.Err.Error(), bootID); ferr != nil {
				err = fmt.Errorf("%w (and its failure is not recorded in etcd: %v)", err, ferr)
			}
		}
		return false, p, fmt.Errorf("host %s keeps its host permit (%s): %w", c.Host(), p, err)
	}
	if err := c.ReleaseHost(ctx, group); err != nil {
		return false, p, err
	}
	return true, nil, nil
}

// Judge is a host's verification verdict (what FinishHost's verify returns) on a report
// of every resource of its plan: agent run's last steps, an apply's report or its status
// after. nil when each is converged and healthy. A resource whose step failed, or that
// converged with nothing left to do but says why it is not healthy (a driver still not
// the wanted one after the reboot), fails the verification: a *VerifyFailure quoting
// each distinct failure once, redacted by red (it is read fleet-wide), which FinishHost
// records and which stops the host group. Anything else not verified (a server still
// starting, a wait for a rollout or host permit, the host drained) is on its way: a plain
// error naming it.
//
// quote, when not nil, says more of a step's error: that it is a wait of the caller's
// own (agent run's dependency waits), or the stable text to quote (a backoff's last
// error without its countdown, so that the same failure reads the same at every pass);
// "" quotes the error itself.
func Judge(rep *agent.Report, red *view.Redactor, quote func(error) (text string, wait bool)) error {
	if rep == nil || len(rep.Steps) == 0 {
		return errors.New("the plan has not been observed yet")
	}
	var bad, failures []string
	fail := func(q string) {
		if q = red.String(q); !slices.Contains(failures, q) {
			failures = append(failures, q)
		}
	}
	for _, st := range rep.Steps {
		if st.Err == nil && st.Status != nil && st.Status.Healthy {
			continue
		}
		var text string
		wait := st.Err != nil && Waits(st.Err)
		if st.Err != nil && !wait && quote != nil {
			text, wait = quote(st.Err)
		}
		switch {
		case st.Err != nil && !wait:
			if text == "" {
				text = st.Err.Error()
			}
			if !strings.HasPrefix(text, st.Addr) {
				text = st.Addr + ": " + text
			}
			fail(text)
		case st.Err == nil && st.Diff != nil && st.Diff.Action == agent.NoOp && len(st.Diff.Warnings) > 0 && st.Status != nil:
			fail(st.Addr + ": " + st.Status.Summary)
		case st.Err != nil:
			bad = append(bad, red.String(fmt.Sprintf("%s: %v", st.Addr, st.Err)))
		default:
			bad = append(bad, st.Addr+": not verified healthy yet")
		}
	}
	if len(failures) > 0 {
		return &VerifyFailure{Err: errors.New(strings.Join(failures, "; "))}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// Waits reports whether err is a "not now" that is no failure, for any caller (Judge,
// agent run's loop, which starts no backoff for it): the rollout group is at
// max_unavailable, the host is drained, or the host group's permits are held elsewhere
// (a driver upgrade waits for the host before it).
func Waits(err error) bool {
	var hr *coord.HostRefusal
	return agent.IsRolloutWait(err) || errors.Is(err, drain.ErrDrained) || errors.As(err, &hr)
}

// VerifyFailure is what FinishHost's verify returns for a host that will not verify
// without a fix (a server failed to serve again, the driver is not the wanted one after
// the reboot), as opposed to one still on its way (any other error): FinishHost records
// it in the permit, which stops the host group fleet-wide until the host is verified.
type VerifyFailure struct{ Err error }

func (f *VerifyFailure) Error() string { return f.Err.Error() }
func (f *VerifyFailure) Unwrap() error { return f.Err }

// recordVerify reports whether a failed verify is recorded over p's failure: not over
// the failure of an earlier step in this boot (an install that failed: what is left
// unverified is its consequence, and the install says why).
func recordVerify(p *coord.HostPermit, bootID string) bool {
	f := p.Failure
	return f == nil || f.Step == coord.StepVerify || f.BootID != bootID
}

// OpenCommand connects a command (agent drain) to the fleet with a lease of its own, not
// agent run's (no lease file: Close revokes it, and a host permit does not live on it),
// and waits up to wait for the lease to be live: a host permit is taken only under one.
func OpenCommand(ctx context.Context, c *plans.Coordination, log *slog.Logger, wait time.Duration) (*coord.Client, error) {
	cl, err := coord.Open(configOf(c, log))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		_, _, _, err := cl.LeaseState()
		if err == nil {
			return cl, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			cl.Close()
			return nil, fmt.Errorf("etcd %s: no lease within %s: %w (check that etcd runs: etcdctl endpoint health)", strings.Join(c.Etcd, ","), wait, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// HostGate is resources.HostDisruption over the fleet's etcd: the driver kind asks it
// for the host permit before a replace and records its reboot in it. Until Attach (and
// without coordination) it asks nothing. One per process: the kinds hold it from before
// the fleet is joined.
type HostGate struct {
	boot func() string
	mu   sync.Mutex
	c    *coord.Client
	p    *plans.Plan
	wait time.Duration // WaitWhileHeld's limit; 0: a refusal is returned at once
}

var _ resources.HostDisruption = (*HostGate)(nil)

// NewHostGate is a gate that reads this boot's id through boot.
func NewHostGate(boot func() string) *HostGate { return &HostGate{boot: boot} }

// Attach makes the gate ask c for host permits under p's host_disruptions (c nil: ask
// nothing again). A nil gate ignores it.
func (g *HostGate) Attach(c *coord.Client, p *plans.Plan) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.c, g.p = c, p
}

func (g *HostGate) get() (*coord.Client, *plans.Plan, time.Duration) {
	if g == nil {
		return nil, nil, 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.p == nil || g.p.Agent.Coordination == nil {
		return nil, nil, 0
	}
	return g.c, g.p, g.wait
}

// Begin implements resources.HostDisruption: the host permit, at most 10 s of asking;
// after WaitWhileHeld, a refusal is waited out (awaitHost).
func (g *HostGate) Begin(ctx context.Context, cause, detail string) error {
	c, p, wait := g.get()
	if c == nil {
		return nil
	}
	req := HostRequest(p, cause, detail, g.boot())
	if wait > 0 {
		return awaitHost(ctx, c, req, wait)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.TakeHost(ctx, req)
	return err
}

// Failed implements resources.HostDisruption: the failed step recorded in this host's
// permit (nothing without one), once per distinct error.
func (g *HostGate) Failed(ctx context.Context, step string, err error) error {
	if !slices.Contains(coord.HostSteps, step) {
		return fmt.Errorf("host disruption: unknown step %q (want one of %s)", step, strings.Join(coord.HostSteps, ", "))
	}
	c, p, _ := g.get()
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// The error is read fleet-wide: a plan's secret in it (an installer URL's token) is not.
	_, ferr := c.FailHost(ctx, p.Agent.Coordination.HostDisruptions.Group, step, view.NewRedactor(p.Secrets()).String(err.Error()), g.boot())
	return ferr
}

// Rebooting implements resources.HostDisruption: the permit (taken if need be) says
// the host reboots from bootID.
func (g *HostGate) Rebooting(ctx context.Context, cause, detail, bootID string) error {
	if err := g.Begin(ctx, cause, detail); err != nil {
		return err
	}
	c, p, _ := g.get()
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.UpdateHost(ctx, p.Agent.Coordination.HostDisruptions.Group, func(hp *coord.HostPermit) {
		hp.State, hp.RebootID = coord.HostRebooting, bootID
	})
}
