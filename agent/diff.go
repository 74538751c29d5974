package agent

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Action is what a Diff will do to a resource.
type Action string

// The actions, from none to most disruptive.
const (
	NoOp    Action = "no-op"
	Adopt   Action = "adopt" // recorded as the agent's, as it runs: nothing on the host changes
	Create  Action = "create"
	Update  Action = "update"  // changed in place, nothing interrupted
	Restart Action = "restart" // changed in place with a restart (a server relaunch)
	Replace Action = "replace" // destroyed and created again
	Delete  Action = "delete"  // removed (ensure = "absent")
)

// Symbol is the diff marker for people: ←, +, ~, ↻, -/+, -.
func (a Action) Symbol() string {
	switch a {
	case Adopt:
		return "←"
	case Create:
		return "+"
	case Update:
		return "~"
	case Restart:
		return "↻"
	case Replace:
		return "-/+"
	case Delete:
		return "-"
	}
	return " "
}

// Destructive reports whether the action stops or removes something that exists.
func (a Action) Destructive() bool { return a == Restart || a == Replace || a == Delete }

// Diff is the difference between the plan and the host for one resource: data, so that
// plan output (human or JSON) and apply work from the same value. A kind lists Changes,
// each with its effect and reason; the engine derives Action from them (Derive), so no
// kind decides by hand how disruptive its diff is.
type Diff struct {
	// Action is what applying the diff does to the resource: the strongest effect of its
	// changes, set by the engine (Derive). A kind may set a floor (a resource that must
	// restart whatever its changes say); the engine never lowers it.
	Action  Action
	Changes []Change
	// Warnings are observations that need no action but an operator should see
	// (extra files in a download destination, a reboot still pending).
	Warnings []string
	// Detail is the resource's own record of what to do, read back by its Apply.
	Detail any
	// Record, when not nil, is what this observation found the resource's own state
	// record must now say (an adoption, a pending launch settled, the time a server was
	// first found not ready): data, since Check writes nothing. The engine keeps it
	// (Engine.keep), under the state lock, before it acts on the diff; a plan keeps
	// nothing.
	Record *RecordUpdate
	// Unfinished describes the break work an earlier make-before-break apply left
	// ("retiring instance qwen on m2 stopped and deleted"), "" when none: observed like
	// everything else, and done by Finisher.Finish once the resource's dependents
	// verified (agent/finish.go). It is no change: a diff with only break work left is
	// a no-op.
	Unfinished string
	// Held, when not "", says that the resource deliberately keeps what runs instead of
	// the plan's inputs (the loop holds a change that was rejected and rolled back), and
	// why: a no-op that is not converged on the plan's inputs. What its last good
	// generation needs is not deleted meanwhile (agent/wayback.go).
	Held string
}

// RecordUpdate is a change of a resource's own state record, as data.
type RecordUpdate struct {
	// Value is the new record (JSON-encoded by the store); nil deletes the record.
	Value any
	// Why says what the observation found, for the log ("adopted pid 4711").
	Why string
}

// SaveRecord is the update that makes v the resource's record.
func SaveRecord(v any, why string) *RecordUpdate { return &RecordUpdate{Value: v, Why: why} }

// DeleteRecord is the update that removes the resource's record.
func DeleteRecord(why string) *RecordUpdate { return &RecordUpdate{Why: why} }

// NoChange is the Diff of a resource that matches the plan.
func NoChange() *Diff { return &Diff{Action: NoOp} }

// Add appends an attribute-level change.
func (d *Diff) Add(c Change) *Diff { d.Changes = append(d.Changes, c); return d }

// Derive sets Action to the strongest effect among the changes (never lower than an
// Action the kind set). A diff without changes is a no-op, whatever its warnings say.
func (d *Diff) Derive() *Diff {
	a := d.Action
	if a == "" {
		a = NoOp
	}
	for _, c := range d.Changes {
		if e := c.effect().Action(); rank(e) > rank(a) {
			a = e
		}
	}
	d.Action = a
	return d
}

func rank(a Action) int {
	switch a {
	case Adopt:
		return 1
	case Update:
		return 2
	case Create:
		return 3
	case Restart:
		return 4
	case Replace:
		return 5
	case Delete:
		return 6
	}
	return 0
}

// Effect is what one change does to its resource when applied.
type Effect string

// The effects, from least to most disruptive.
const (
	Adopts        Effect = "adopt"    // recorded as the agent's, as it runs: nothing on the host changes
	InPlace       Effect = "in-place" // changed where it is, nothing interrupted
	Creates       Effect = "create"   // the resource does not exist yet: made
	Restarts      Effect = "restart"  // the resource is restarted (a server relaunch)
	Replaces      Effect = "replace"  // destroyed and created again
	Deletes       Effect = "delete"   // removed from the host
	defaultEffect        = InPlace
)

// Action is the resource action an effect amounts to.
func (e Effect) Action() Action {
	switch e {
	case Adopts:
		return Adopt
	case Creates:
		return Create
	case Restarts:
		return Restart
	case Replaces:
		return Replace
	case Deletes:
		return Delete
	}
	return Update
}

// Reason says why a change is needed. The set is fixed (docs/json-output.md) so that
// machines can act on it.
type Reason string

// The reasons.
const (
	// ReasonMissing: not on the host yet.
	ReasonMissing Reason = "missing"
	// ReasonDiffers: on the host, but not as the plan says.
	ReasonDiffers Reason = "differs"
	// ReasonIdentity: part of what the resource is (a server's argv, environment,
	// place): a change means a new one.
	ReasonIdentity Reason = "identity"
	// ReasonImmutable: fixed at creation (a container's image): only a replace changes it.
	ReasonImmutable Reason = "immutable"
	// ReasonGone: what the agent launched or made is gone (a crashed server).
	ReasonGone Reason = "gone"
	// ReasonUnhealthy: it runs but has failed its health checks for too long.
	ReasonUnhealthy Reason = "unhealthy"
	// ReasonUnverified: it may be right, but only a verification proves it (a hash).
	ReasonUnverified Reason = "unverified"
	// ReasonForeign: something the agent did not start is in the way (takeover = true).
	ReasonForeign Reason = "foreign"
	// ReasonReboot: a reboot completes it.
	ReasonReboot Reason = "reboot"
	// ReasonEnsureAbsent: the plan says ensure = "absent".
	ReasonEnsureAbsent Reason = "ensure_absent"
	// ReasonOrphan: recorded in state, but its block is gone from the plan.
	ReasonOrphan Reason = "orphan"
	// ReasonDestroy: `agent destroy` removes everything the plan manages.
	ReasonDestroy Reason = "destroy"
	// ReasonMigrate: placed on another cluster member (a container's target changed),
	// make before break: the new one verified before the old one is stopped.
	ReasonMigrate Reason = "migrate"
	// ReasonUnrecorded: it runs exactly as the plan says, but no record names it yet
	// (a server started by hand, found by `agent export`): adopted, as an import is.
	ReasonUnrecorded Reason = "unrecorded"
	// ReasonWedged: it runs and its front end answers, but its engine is proven wedged
	// (its liveness probes went unanswered and it made no progress meanwhile).
	ReasonWedged Reason = "wedged"
	// ReasonGPUFault: a GPU it uses raised a fault that asks for the application to be
	// restarted (an Xid of NVIDIA's catalog), quoted (docs/gpu.md, "When a GPU fails").
	ReasonGPUFault Reason = "gpu_fault"
)

// Reasons lists every reason, for documentation and tests.
var Reasons = []Reason{ReasonMissing, ReasonDiffers, ReasonIdentity, ReasonImmutable, ReasonGone, ReasonUnhealthy,
	ReasonUnverified, ReasonForeign, ReasonReboot, ReasonEnsureAbsent, ReasonOrphan, ReasonDestroy, ReasonMigrate, ReasonUnrecorded, ReasonWedged, ReasonGPUFault}

// Describe is the reason for people.
func (r Reason) Describe() string {
	switch r {
	case ReasonMissing:
		return "not on the host"
	case ReasonDiffers:
		return "differs from the plan"
	case ReasonIdentity:
		return "identity changed"
	case ReasonImmutable:
		return "fixed at creation"
	case ReasonGone:
		return "gone"
	case ReasonUnhealthy:
		return "unhealthy"
	case ReasonUnverified:
		return "not verified"
	case ReasonForeign:
		return "not started by this agent"
	case ReasonReboot:
		return "needs a reboot"
	case ReasonEnsureAbsent:
		return `ensure = "absent"`
	case ReasonOrphan:
		return "no longer in the plan"
	case ReasonDestroy:
		return "agent destroy"
	case ReasonMigrate:
		return "moves to another member, make before break"
	case ReasonUnrecorded:
		return "runs as planned, not recorded yet"
	case ReasonWedged:
		return "engine wedged"
	case ReasonGPUFault:
		return "its GPU faulted"
	}
	return string(r)
}

// Change is one attribute's difference. Old and New are Go values (strings, numbers,
// booleans, lists, maps) until a view renders them: the human view as the plan writes
// them, --json as JSON values.
type Change struct {
	// Attr names the attribute as the plan does: `mode`, `flags["tp-size"]`.
	Attr string
	// Old and New are the values (nil with HasOld/HasNew false when absent).
	Old    any
	New    any
	HasOld bool
	HasNew bool
	// Sensitive values are never printed, in any output.
	Sensitive bool
	// Effect is what the change does to the resource (InPlace when empty); Reason why
	// it is needed (ReasonDiffers when empty).
	Effect Effect
	Reason Reason
	// Note adds what the effect and reason do not say ("hashed, re-downloaded if wrong").
	Note string
	// Text is a multi-line rendering (a unified diff of file content), shown indented.
	Text string
}

func (c Change) effect() Effect {
	if c.Effect == "" {
		return defaultEffect
	}
	return c.Effect
}

// Why is the change's reason (ReasonDiffers when the kind gave none).
func (c Change) Why() Reason {
	if c.Reason == "" {
		return ReasonDiffers
	}
	return c.Reason
}

// EffectOf is the change's effect (InPlace when the kind gave none).
func (c Change) EffectOf() Effect { return c.effect() }

// Because returns c with its effect and reason.
func (c Change) Because(e Effect, r Reason) Change { c.Effect, c.Reason = e, r; return c }

// Set is a change from old to new (in place, because it differs, until Because says
// otherwise).
func Set(attr string, old, new any) Change {
	return Change{Attr: attr, Old: old, New: new, HasOld: true, HasNew: true}
}

// Added is an attribute that appears.
func Added(attr string, new any) Change {
	return Change{Attr: attr, New: new, HasNew: true}
}

// Removed is an attribute that goes away.
func Removed(attr string, old any) Change {
	return Change{Attr: attr, Old: old, HasOld: true}
}

// Render formats a value for people as a plan writes it: strings quoted, numbers and
// booleans bare, lists in brackets, maps in braces.
func Render(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case fmt.Stringer:
		return v.String()
	case nil:
		return "null"
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case []any:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = Render(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	case map[string]string:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		q := make([]string, len(keys))
		for i, k := range keys {
			q[i] = strconv.Quote(k) + " = " + strconv.Quote(v[k])
		}
		return "{" + strings.Join(q, ", ") + "}"
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		q := make([]string, len(keys))
		for i, k := range keys {
			q[i] = strconv.Quote(k) + " = " + Render(v[k])
		}
		return "{" + strings.Join(q, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// Raw is a value already written for people (a sentence such as "pid 12 is gone"): the
// human view prints it unquoted; --json emits it as a string.
type Raw string

func (r Raw) String() string { return string(r) }

// Summary counts the actions of a set of diffs, for "Plan: 1 to create, …".
type Summary struct {
	// Adopt is only in documents that adopt something, so that every other document
	// reads as it always did.
	Adopt   int `json:"adopt,omitempty"`
	Create  int `json:"create"`
	Update  int `json:"update"`
	Restart int `json:"restart"`
	Replace int `json:"replace"`
	Delete  int `json:"delete"`
}

func (s *Summary) count(a Action) {
	switch a {
	case Adopt:
		s.Adopt++
	case Create:
		s.Create++
	case Update:
		s.Update++
	case Restart:
		s.Restart++
	case Replace:
		s.Replace++
	case Delete:
		s.Delete++
	}
}

// Total is the number of resources that change.
func (s Summary) Total() int { return s.Adopt + s.Create + s.Update + s.Restart + s.Replace + s.Delete }

// String is "1 to create, 0 to update, …", led by "N to adopt" only when some adopt (as
// Terraform names imports only when a plan has some).
func (s Summary) String() string {
	var parts []string
	if s.Adopt > 0 {
		parts = append(parts, fmt.Sprintf("%d to adopt", s.Adopt))
	}
	for _, p := range []struct {
		n    int
		verb string
	}{{s.Create, "create"}, {s.Update, "update"}, {s.Restart, "restart"}, {s.Replace, "replace"}, {s.Delete, "delete"}} {
		parts = append(parts, fmt.Sprintf("%d to %s", p.n, p.verb))
	}
	return strings.Join(parts, ", ")
}
