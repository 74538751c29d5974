package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// A saved plan (agent plan -out FILE, agent apply FILE) is applied only to the host it
// was computed from. Plan, with Options.FingerprintKey, fingerprints every observation
// (fingerprint.go); ApplySaved observes every resource again, refuses, touching nothing,
// when any fingerprint differs, and otherwise runs the one Apply, whose steps each check
// their fresh observation against the saved fingerprint once more before acting (the
// host may change during a long apply).

// ErrStale is wrapped by the error of a saved plan's step whose observation no longer
// matches the saved one, and by StaleError.
var ErrStale = errors.New("changed since the plan was saved")

// Unwrap makes errors.Is(err, ErrStale) hold for a StaleError.
func (e *StaleError) Unwrap() error { return ErrStale }

// savedRun is the saved plan an ApplySaved applies.
type savedRun struct {
	want map[string]Fingerprint
	mu   sync.Mutex
	// done are the resources this apply changed and verified: what depends on one of
	// them is observed after a change the saved plan made, so only its action must
	// still match.
	done map[string]bool
}

// applied records that addr was changed and verified by this apply (nil-safe).
func (s *savedRun) applied(addr string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done[addr] = true
}

// vet is the check of addr's observation right before its step acts (nil when no saved
// plan is applied). The observation must match its fingerprint; when a resource it
// depends on (or an orphan) was changed by this apply, its changes may differ (they
// compare with what that change made) but its action may not, unless nothing is left to
// do: the saved plan applies what was reviewed, never another action.
func (s *savedRun) vet(e *Engine, addr string) func(*Diff) error {
	if s == nil {
		return nil
	}
	return func(d *Diff) error {
		want, ok := s.want[addr]
		if !ok {
			return fmt.Errorf("%s: %w: not in the saved plan; nothing done to it", addr, ErrStale)
		}
		s.mu.Lock()
		after := false
		for _, a := range append(e.full.Upstream(addr), e.orphans...) {
			after = after || s.done[a]
		}
		s.mu.Unlock()
		if after {
			if d.Action != want.Action && d.Action != NoOp {
				return fmt.Errorf("%s: %w: after the changes it depends on, planned %s, now %s; not applied (make a new plan and review it)", addr, ErrStale, want.Action, d.Action)
			}
			return nil
		}
		now, err := e.fingerprint(addr, d)
		if err != nil {
			return err
		}
		if diffs := want.Differences(now, d); len(diffs) > 0 {
			return fmt.Errorf("%s: %w: %s; not applied (make a new plan and review it)", addr, ErrStale, strings.Join(diffs, "; "))
		}
		return nil
	}
}

// ApplySaved applies a saved plan: want are the fingerprints its Plan took, by address.
// Every resource is observed again first; when one differs (or the resources are not the
// same ones), it returns a *StaleError and changes nothing, not even a state record.
// Otherwise it calls begin (when not nil; its error stops it there: the caller records
// that the saved plan is being applied) and runs Apply, each step vetted against its
// fingerprint before it acts. An error from the first observation (a resource that cannot
// be observed) is returned as is. The engine must have been made with the saved plan's
// FingerprintKey and options.
func (e *Engine) ApplySaved(ctx context.Context, want map[string]Fingerprint, begin func() error, onEvent func(Event)) (*Report, error) {
	if e.opts.FingerprintKey == nil {
		return nil, errors.New("internal error: ApplySaved without Options.FingerprintKey")
	}
	stale := &StaleError{Changed: map[string][]string{}}
	addrs := e.addrs()
	for _, a := range slices.Sorted(maps.Keys(want)) {
		if !slices.Contains(addrs, a) {
			stale.Changed[a] = []string{"in the saved plan, but no longer in the plan or its state"}
		}
	}
	rep := e.Plan(ctx)
	var errs []error
	for _, st := range rep.Steps {
		if st.Err != nil {
			errs = append(errs, st.Err)
			continue
		}
		saved, ok := want[st.Addr]
		if !ok {
			stale.Changed[st.Addr] = []string{fmt.Sprintf("not in the saved plan (now %s)", st.Diff.Action)}
			continue
		}
		if diffs := saved.Differences(*st.Fingerprint, st.Diff); len(diffs) > 0 {
			stale.Changed[st.Addr] = diffs
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("observe before applying the saved plan: %w", errors.Join(errs...))
	}
	if len(stale.Changed) > 0 {
		return nil, stale
	}
	if begin != nil {
		if err := begin(); err != nil {
			return nil, err
		}
	}
	e.saved = &savedRun{want: want, done: map[string]bool{}}
	defer func() { e.saved = nil }()
	return e.Apply(ctx, onEvent), nil
}
