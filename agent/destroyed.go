package agent

import (
	"context"
	"strings"
	"sync"
	"time"
)

// recordDestroyed notes, after agent destroy, the resources it removed and verified
// (state.Store.LoadDestroyed), so that status then says "absent", healthy, instead of
// calling a destroyed plan degraded ("incomplete", "not running").
func (e *Engine) recordDestroyed(rep *Report, removed map[string]Resource) {
	destroyedMu.Lock()
	defer destroyedMu.Unlock()
	m, err := e.store.LoadDestroyed()
	if err != nil {
		e.log.Warn("cannot read which resources agent destroy removed", "error", err)
		return
	}
	now := time.Now().UTC()
	for _, st := range rep.Steps {
		if _, ok := removed[st.Addr].(kept); ok || st.Orphan || st.Err != nil {
			continue
		}
		if _, ok := e.resources[st.Addr].(Ensurer); ok {
			m[st.Addr] = now
		}
	}
	if err := e.store.SaveDestroyed(m); err != nil {
		e.log.Warn("cannot record which resources agent destroy removed", "error", err)
	}
}

// destroyedStatus is the status of a resource agent destroy removed and nothing applied
// since (it has no record): its kind's absent form says whether anything of it is left
// (healthy "absent" when not). It reports false for any other resource.
func (e *Engine) destroyedStatus(ctx context.Context, st *Step) bool {
	en, ok := e.resources[st.Addr].(Ensurer)
	if !ok || e.store == nil {
		return false
	}
	m, err := e.store.LoadDestroyed()
	if _, destroyed := m[st.Addr]; err != nil || !destroyed {
		return false // (an apply since forgot it: forgetDestroyed)
	}
	absent := en.AsAbsent()
	if s, ok := absent.(Statuser); ok {
		st.Err = e.guard(ctx, st.Addr, "status", func(ctx context.Context) error {
			var err error
			st.Status, err = s.Status(ctx, e.env(st.Addr))
			return err
		})
		if st.Err != nil {
			st.Err = withAddr(st.Addr, "status", st.Err)
			return true
		}
	} else {
		d, err := absent.Check(ctx, e.env(st.Addr))
		if err != nil {
			st.Err = withAddr(st.Addr, "status", err)
			return true
		}
		st.Status = &Status{Healthy: d.Action == NoOp, Summary: "absent"}
		if d.Action != NoOp {
			st.Status.Summary = "partly present: " + describe(d)
		}
	}
	if st.Status.Healthy && !strings.HasPrefix(st.Status.Summary, "absent") {
		st.Status.Summary = "absent: " + st.Status.Summary
	}
	return true
}

var destroyedMu sync.Mutex // steps apply in parallel; destroyed.json is read, changed, written

// forgetDestroyed drops addr from what agent destroy removed, once an apply acted on it:
// its status is its kind's again.
func (e *Engine) forgetDestroyed(addr string) {
	if e.destroying || e.store == nil {
		return
	}
	destroyedMu.Lock()
	defer destroyedMu.Unlock()
	m, err := e.store.LoadDestroyed()
	if _, ok := m[addr]; err != nil || !ok {
		return
	}
	delete(m, addr)
	if err := e.store.SaveDestroyed(m); err != nil {
		e.log.Warn("cannot record that agent destroy's removal was undone", "resource", addr, "error", err)
	}
}
