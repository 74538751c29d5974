package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// Resource is one declared resource bound to its configuration.
type Resource interface {
	// Check observes the host and returns what Apply would have to change. It must not
	// change the host. A state the resource cannot act on is an error; "not there yet"
	// is a Diff.
	Check(ctx context.Context, env *Env) (*Diff, error)
	// Apply carries out d, returned by Check moments before, and verifies the result of
	// each step it takes. The engine calls Check afterwards to prove convergence.
	Apply(ctx context.Context, env *Env, d *Diff) error
}

// Statuser is implemented by resources whose live status says more than "matches the plan"
// (a server's PID, generation and serving metrics). Without it, status is derived from Check.
type Statuser interface {
	Status(ctx context.Context, env *Env) (*Status, error)
}

// Timeouter is implemented by resources whose steps may legitimately take longer (or
// must take less) than the engine's default step timeout: a server's readiness timeout,
// a 52 GB download.
type Timeouter interface {
	Timeout() time.Duration
}

// Env is what a resource gets from the engine for one call: its address, its own state
// record, a logger, and the plan-wide settings. Resources take nothing from globals.
type Env struct {
	Addr  string
	State *state.Scoped
	Log   *slog.Logger
	Plan  *plans.Plan
	// Now is the clock; tests may replace it.
	Now func() time.Time
	// Probe asks Status for the probes that load a production server (a server's smoke
	// test: a real completion of up to max_tokens). Off by default, so that status and
	// every pass of the reconcile loop stay cheap; `agent status --smoke` sets it.
	Probe bool
	// Loop is set when the reconcile loop (`agent run`) runs the step, unattended: a
	// kind does not try again on its own what it recorded as rejected (a server's change
	// that failed and was rolled back), while a person's `agent apply` tries it once more.
	Loop bool
	// OnProgress receives what the resource reports through Progress, with Addr set
	// (the engine passes Options.Progress; nil: nobody listens).
	OnProgress func(Progress)
	// Memory is what the kinds remember between steps in this process (Options.Memory):
	// never a judgement's only record where the state holds one.
	Memory *Memory
}

// Kind is a resource type: its name in plans, its configuration schema, and how to bind a
// decoded configuration to a Resource.
type Kind struct {
	Name string
	// NewConfig returns a new pointer to the kind's configuration struct (gohcl tags).
	NewConfig func() any
	// Bind validates a decoded configuration beyond what its types say (paths absolute,
	// modes octal, one of two attributes) and returns the Resource. Errors are
	// diagnostics pointing into the plan (use r.Range for their subject). Bind must not
	// touch the host: `agent validate` calls it.
	Bind func(r *plans.Resource) (Resource, hcl.Diagnostics)
	// Orphan, when set, builds from its state record alone the resource that deletes what
	// addr was: the record of a block gone from the plan (a server's verified stop). A
	// nil Resource with a nil error means nothing is left to delete (a record of
	// something already removed), and the address is not shown. Kinds without Orphan
	// are never deleted by the agent (an nvidia_driver); their orphans are reported.
	// The plan's agent block comes with it, as a bound resource has it (plans.Resource.Agent).
	Orphan func(addr string, st *state.Scoped, agentBlock *plans.AgentSettings) (Resource, error)
	// Guarded kinds serve (server): an apply that would delete every one of them that the
	// agent manages, and keep none, needs Options.AllowDeleteAll, so that a plan emptied
	// by a missing var file cannot take a host's serving down.
	Guarded bool
}

// NewKind builds a Kind from a typed bind function, so each kind works with its own
// configuration type instead of any.
func NewKind[C any](name string, bind func(r *plans.Resource, cfg *C) (Resource, hcl.Diagnostics)) Kind {
	return Kind{
		Name:      name,
		NewConfig: func() any { return new(C) },
		Bind: func(r *plans.Resource) (Resource, hcl.Diagnostics) {
			cfg, ok := r.Config.(*C)
			if !ok {
				return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Internal error",
					Detail: fmt.Sprintf("%s: configuration is %T, want *%T", r.Addr, r.Config, *new(C)), Subject: r.DeclRange.Ptr()}}
			}
			return bind(r, cfg)
		},
	}
}

// Schemas returns the configuration schemas of kinds, as the plan loader wants them.
func Schemas(kinds []Kind) map[string]func() any {
	m := make(map[string]func() any, len(kinds))
	for _, k := range kinds {
		m[k.Name] = k.NewConfig
	}
	return m
}

// Status is the live state of one resource, for `agent status`.
type Status struct {
	// Healthy is false when the resource is degraded: it differs from the plan, or it
	// matches but does not work (a server that fails its smoke test).
	Healthy bool `json:"healthy"`
	// Summary is one line for people ("running, ready, generation 7").
	Summary string `json:"summary"`
	// Fields are observed facts in display order (PID, start time, log age, accept rate).
	Fields []Field `json:"fields"`
	// Metrics are the same facts as numbers, for Prometheus: `agent run` exports each as
	// agent_<kind>_<key>{resource="<address>", kind="<kind>"}
	// (agent_server_accept_length{resource="server.qwen", kind="server"}). Keys are
	// snake_case with the unit last (done_bytes, eta_seconds); booleans are 0 or 1.
	Metrics map[string]float64 `json:"metrics"`
	// Series are numbers that need labels of their own besides the resource's (a server's
	// start time per phase): `agent run` exports each as
	// agent_<kind>_<name>{resource, kind, <its labels>}. The series of one name carry the
	// same label names (Prometheus wants one label set per metric name): give a label
	// that does not apply the value "".
	Series []Series `json:"series"`
	// Faults are the faults the resource saw on what it manages, newest last (the
	// nvidia_driver's GPUs' Xid errors and health, docs/gpu.md): typed for machines, shown
	// to people through Fields.
	Faults []Fault `json:"faults"`
}

// Fault is one fault seen on something a resource manages.
type Fault struct {
	At      time.Time `json:"at"`
	Subject string    `json:"subject"` // what faulted, as the plan's notation indexes it: "gpu[1]"
	Device  string    `json:"device"`  // its address on the host ("0000:41:00.0"); "" when none
	Kind    string    `json:"kind"`    // "xid", "gpu-lost", "remap-failed", …
	Code    int       `json:"code"`    // the Xid; 0 when the kind has no code
	Action  string    `json:"action"`  // what it asks for: "ignore", "contact-support", "restart-app", "reset-gpu", "reboot"
	Text    string    `json:"text"`
	Line    string    `json:"line"` // the log line that reported it, quoted; "" when none
}

// Series is one labelled number of a Status: Name as a Metrics key (snake_case, unit
// last), Labels with snake_case names other than resource, kind, name and member (the
// labels `agent run` adds).
type Series struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	Value  float64           `json:"value"`
}

// MemberField is the key of the Status field naming the cluster member a resource lives
// on (an Incus instance's location, a server's container's). `agent run` adds it to the
// resource's metrics as the label member="…".
const MemberField = "member"

// Member returns the text of the status's MemberField; "" when it has none.
func (s *Status) Member() string {
	if s == nil {
		return ""
	}
	for _, f := range s.Fields {
		if f.Key == MemberField {
			return f.Text
		}
	}
	return ""
}

// terminalError marks an error that retrying cannot fix (a bad plan value, a reboot the
// plan does not allow): the reconcile loop stops retrying the resource until the plan or
// the host changes.
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// Terminal marks err as terminal.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err: err}
}

// IsTerminal reports whether err, or an error it wraps, was marked with Terminal.
func IsTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}

// unavailableError marks an error that says the resource can be neither observed nor
// changed until something outside the agent is back (its Incus cluster member is
// offline): retrying sooner cannot help, and its Watch can tell when it may be back.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as Unavailable: the reconcile loop keeps its backoff, and also
// watches the resource (Watcher) after such a failure, so it is observed again as soon
// as its watch says what it waits for may be back, not at the end of a backoff that
// grows to minutes over a long outage.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

// IsUnavailable reports whether err, or an error it wraps, was marked with Unavailable.
func IsUnavailable(err error) bool {
	var u *unavailableError
	return errors.As(err, &u)
}

// Watcher is implemented by resources that can notice cheaply, between observations,
// that what they last verified may no longer hold: a launched server's process exited.
// The reconcile loop watches a resource after each verified reconcile (and after a
// failure marked Unavailable) and observes it again as soon as Watch returns, instead
// of at its next resync, so a crashed server is relaunched in seconds. Watch is a hint,
// never a verdict: the loop always decides from a fresh Check. A watch should not
// return again for a change it already reported (a member still offline): each return
// is a reconcile and a log line.
type Watcher interface {
	// Watch blocks until the resource may have changed or ctx ends, and returns nil
	// then. It returns ErrNothingToWatch at once when there is nothing to watch (no
	// recorded process): the loop then relies on its resync interval alone.
	Watch(ctx context.Context, env *Env) error
}

// ErrNothingToWatch is returned by Watch when the resource has nothing to watch.
var ErrNothingToWatch = errors.New("nothing to watch")
