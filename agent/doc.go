// Package agent is the engine: it binds a loaded plan to resource implementations,
// observes the host, computes typed diffs, and applies them in dependency order.
//
// Each resource kind implements one small interface, Resource: Check observes the host and
// returns a Diff without changing anything; Apply carries a Diff out and verifies it.
// `agent plan` is Check on every resource; `agent apply` walks the dependency graph and,
// for each resource, calls Check again right before acting (so it never acts on stale
// data), Apply when the diff is not a no-op, and Check once more to prove the host now
// matches. Plan and apply therefore share one code path: a plan that says "no changes"
// makes apply do nothing, and an apply that leaves a difference fails instead of
// reporting success.
package agent
