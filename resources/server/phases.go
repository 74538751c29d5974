package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/lifecycle"
)

// A launch's start phases (weights loaded, KV cache allocated, CUDA graphs captured,
// ready: engines.StartPhases) are read from its own log once, when its verification
// ends, and kept in its record with the whole start's time: status reads the record,
// not the log, and a relaunch keeps the previous start to compare the next one with. A
// start still in progress (or a record from before this) shows the phases the status's
// one pass over the log found (engines.Metrics.Phases).

// phaseNames are the phases' labels in the human status, short enough to keep its column.
var phaseNames = map[engines.Phase]string{
	engines.PhaseWeights: "weights", engines.PhaseKVCache: "KV cache", engines.PhaseCUDAGraphs: "CUDA graphs", engines.PhaseReady: "ready",
}

// A start says it was slower than the previous start of the same identity when it took
// more than slowerFactor times as long, and at least slowerFloor more: a start of a few
// seconds varies by more than half with the host's load, and is no news.
const (
	slowerFactor = 1.5
	slowerFloor  = 10 * time.Second
)

// startRecord is one verified start: its generation, the identity it launched (a digest:
// only equality matters), how long it took from launch to ready, and its phases.
type startRecord struct {
	Generation int           `json:"generation"`
	Identity   string        `json:"identity"`
	Took       time.Duration `json:"took"`
	Phases     []startPhase  `json:"phases,omitempty"`
}

// startPhase is one phase and the time it took since the phase before it (the first:
// since the launch).
type startPhase struct {
	Phase     engines.Phase `json:"phase"`
	Took      time.Duration `json:"took"`
	Estimated bool          `json:"estimated,omitempty"`
}

// startIdentity is a digest of the identity rec launched (what identityChanges compares;
// secrets are digests already): two starts compare only when it is the same.
func startIdentity(rec *serverRecord) string {
	b, _ := json.Marshal([]any{rec.Place, rec.Argv, rec.Command, rec.Flags, rec.Args, rec.Env, rec.Workdir, rec.User, rec.Home})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// phaseDurations turns the marks of a launch at launched into each phase's own time.
func phaseDurations(marks []engines.PhaseMark, launched time.Time) []startPhase {
	var out []startPhase
	prev := launched.Truncate(time.Second) // log times have whole seconds
	for _, m := range marks {
		out = append(out, startPhase{Phase: m.Phase, Took: max(m.At.Sub(prev), 0), Estimated: m.Estimated})
		prev = m.At
	}
	return out
}

// lastStart is the newest verified start a record knows: its own, or the one it kept.
func lastStart(rec *serverRecord) *startRecord {
	switch {
	case rec == nil:
		return nil
	case rec.Start != nil:
		return rec.Start
	}
	return rec.PrevStart
}

// recordStart reads the phases of rec's launch from its log (one pass, at the end of its
// verification: the log is then little more than the start) and records them with the
// start's time; it logs a start much slower than the previous one of its identity.
func recordStart(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord) {
	if rec.ReadyAt.IsZero() || rec.LaunchedAt.IsZero() || rec.Adopted {
		return
	}
	// Wall clock (Round(0)), as the record keeps both times.
	st := &startRecord{Generation: rec.Generation, Identity: startIdentity(rec), Took: rec.ReadyAt.Round(0).Sub(rec.LaunchedAt.Round(0))}
	if p := hostPath(ctx, lc, rec); p != "" {
		if m, err := lifecycle.ScanLog(ctx, p); err == nil {
			st.Phases = phaseDurations(m.Phases, rec.LaunchedAt)
		}
	}
	rec.Start = st
	if text := slowerStart(st, rec.PrevStart); text != "" {
		env.Log.Warn(text, "generation", rec.Generation)
	}
}

// slowerStart says how start cur was slower than prev when it took more than
// slowerFactor times as long (and slowerFloor more) and launched the same identity (""
// otherwise), naming the phase that grew most.
func slowerStart(cur, prev *startRecord) string {
	if cur == nil || prev == nil || cur.Identity != prev.Identity || prev.Took <= 0 {
		return ""
	}
	ratio := float64(cur.Took) / float64(prev.Took)
	if ratio <= slowerFactor || cur.Took-prev.Took < slowerFloor {
		return ""
	}
	text := fmt.Sprintf("start took %s, %.1f× the previous start of this identity (%s, generation %d)",
		agent.Age(cur.Took), ratio, agent.Age(prev.Took), prev.Generation)
	var grew *startPhase
	var was time.Duration
	for i, p := range cur.Phases {
		for _, q := range prev.Phases {
			if q.Phase == p.Phase && p.Took-q.Took > 0 && (grew == nil || p.Took-q.Took > grew.Took-was) {
				grew, was = &cur.Phases[i], q.Took
			}
		}
	}
	if grew != nil {
		text += fmt.Sprintf(": %s %s (was %s)", phaseNames[grew.Phase], agent.Age(grew.Took), agent.Age(was))
	}
	return text
}

// statusPhases adds the start phases of the recorded generation, each with the time it
// took since the phase before it (the first since the launch), so that a ten-minute start
// says where its time went: as recorded once the launch verified, else as its log shows
// them now (marks, from the status's one pass over it). Each is also the series
// start_phase_seconds{phase}; a recorded start adds its whole time and, when it was much
// slower than the previous start of its identity, says so (information, not a fault).
func statusPhases(st *agent.Status, rec *serverRecord, marks []engines.PhaseMark) {
	if rec.LaunchedAt.IsZero() {
		return
	}
	phases := phaseDurations(marks, rec.LaunchedAt)
	if rec.Start != nil && rec.Start.Generation == rec.Generation {
		phases = rec.Start.Phases
	}
	for _, p := range phases {
		f := agent.DurationField("start_"+string(p.Phase)+"_seconds", "start: "+phaseNames[p.Phase], p.Took)
		if p.Estimated {
			f.Text += " (about: its line has no time)"
		}
		st.Fields = append(st.Fields, f)
		st.Series = append(st.Series, agent.Series{Name: "start_phase_seconds", Labels: map[string]string{"phase": string(p.Phase)}, Value: p.Took.Seconds()})
	}
	if rec.Start == nil || rec.Start.Generation != rec.Generation {
		return
	}
	st.Fields = append(st.Fields, agent.DurationField("start_seconds", "start: total", rec.Start.Took))
	st.Metrics["start_seconds"] = rec.Start.Took.Seconds()
	if text := slowerStart(rec.Start, rec.PrevStart); text != "" {
		st.Fields = append(st.Fields, agent.TextField("start_slower", "start: slower", strings.TrimPrefix(text, "start ")))
	}
}
