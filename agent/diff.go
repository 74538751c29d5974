package agent

import (
	"fmt"
	"strconv"
	"strings"
)

// Action is what a Diff will do to a resource.
type Action string

// The actions, from none to most disruptive.
const (
	NoOp    Action = "no-op"
	Create  Action = "create"
	Update  Action = "update"  // changed in place, nothing interrupted
	Restart Action = "restart" // changed in place with a restart (a server relaunch)
	Replace Action = "replace" // destroyed and created again
	Delete  Action = "delete"  // removed (ensure = "absent")
)

// Symbol is the diff marker for people: +, ~, ↻, -/+, -.
func (a Action) Symbol() string {
	switch a {
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
// plan output (human or JSON) and apply work from the same value.
type Diff struct {
	Action  Action
	Changes []Change
	// Warnings are observations that need no action but an operator should see
	// (extra files in a download destination, a reboot still pending).
	Warnings []string
	// Detail is the resource's own record of what to do, read back by its Apply.
	Detail any
}

// NoChange is the Diff of a resource that matches the plan.
func NoChange() *Diff { return &Diff{Action: NoOp} }

// Add appends an attribute-level change.
func (d *Diff) Add(c Change) *Diff { d.Changes = append(d.Changes, c); return d }

// Change is one attribute's difference.
type Change struct {
	// Attr names the attribute as the plan does: `mode`, `flags["tp-size"]`.
	Attr string `json:"attribute"`
	// Old and New are rendered values ("" with HasOld/HasNew false when absent).
	Old    string `json:"old,omitempty"`
	New    string `json:"new,omitempty"`
	HasOld bool   `json:"-"`
	HasNew bool   `json:"-"`
	// Sensitive values are never printed, in any output.
	Sensitive bool `json:"sensitive,omitempty"`
	// Note says what the change implies: "restart", "forces replacement".
	Note string `json:"note,omitempty"`
	// Text is a multi-line rendering (a unified diff of file content), shown indented.
	Text string `json:"text,omitempty"`
}

// Set is a change from old to new.
func Set(attr string, old, new any) Change {
	return Change{Attr: attr, Old: Render(old), New: Render(new), HasOld: true, HasNew: true}
}

// Added is an attribute that appears.
func Added(attr string, new any) Change {
	return Change{Attr: attr, New: Render(new), HasNew: true}
}

// Removed is an attribute that goes away.
func Removed(attr string, old any) Change {
	return Change{Attr: attr, Old: Render(old), HasOld: true}
}

// Render formats a value for a diff: strings quoted, numbers and booleans bare.
func Render(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case fmt.Stringer:
		return v.String()
	case nil:
		return "null"
	}
	return fmt.Sprint(v)
}

// Summary counts the actions of a set of diffs, for "Plan: 1 to create, …".
type Summary struct {
	Create  int `json:"create"`
	Update  int `json:"update"`
	Restart int `json:"restart"`
	Replace int `json:"replace"`
	Delete  int `json:"delete"`
}

func (s *Summary) count(a Action) {
	switch a {
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
func (s Summary) Total() int { return s.Create + s.Update + s.Restart + s.Replace + s.Delete }

func (s Summary) String() string {
	var parts []string
	for _, p := range []struct {
		n    int
		verb string
	}{{s.Create, "create"}, {s.Update, "update"}, {s.Restart, "restart"}, {s.Replace, "replace"}, {s.Delete, "delete"}} {
		parts = append(parts, fmt.Sprintf("%d to %s", p.n, p.verb))
	}
	return strings.Join(parts, ", ")
}
