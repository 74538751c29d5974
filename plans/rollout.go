package plans

import (
	"fmt"
	"sort"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// Rollout is a resource's rollout block: the group whose disruptive steps (restart,
// replace, delete) the engine runs at most MaxUnavailable at a time across the plan. It is
// a meta-block like depends_on: every kind may carry it, the loader parses it, the engine
// enforces it, and no kind sees it.
type Rollout struct {
	Group          string
	MaxUnavailable int
	DeclRange      hcl.Range
}

// DefaultMaxUnavailable is a rollout's max_unavailable when the block does not say.
const DefaultMaxUnavailable = 1

type rolloutBlock struct {
	Group          string `hcl:"group"`
	MaxUnavailable *int   `hcl:"max_unavailable,optional"`
}

// rolloutSchema is the part of a resource body the loader takes before the kind's schema
// sees it: the meta-arguments.
var rolloutSchema = hcl.BlockHeaderSchema{Type: "rollout"}

// decodeRollout decodes a resource's rollout block (nil when it has none). Its values
// may use variables and locals: the group of a host's servers often comes from its var
// file.
func (l *loader) decodeRollout(rb *resourceBlock) {
	if len(rb.rollouts) == 0 {
		return
	}
	if len(rb.rollouts) > 1 {
		l.errorAt(rb.rollouts[1].DefRange, "Duplicate rollout block",
			fmt.Sprintf("%s already has a rollout block at %s; a resource belongs to one rollout group.", rb.res.Addr, rb.rollouts[0].DefRange))
		rb.failed = true
		return
	}
	b := rb.rollouts[0]
	var rc rolloutBlock
	diags := gohcl.DecodeBody(b.Body, l.evalContext(false), &rc)
	l.diags = append(l.diags, diags...)
	if diags.HasErrors() {
		rb.failed = true
		return
	}
	r := &Rollout{Group: rc.Group, MaxUnavailable: DefaultMaxUnavailable, DeclRange: b.DefRange}
	if !hclsyntax.ValidIdentifier(r.Group) {
		l.errorAt(attrRange(b.Body, b.DefRange, "group"), "Invalid rollout group",
			fmt.Sprintf("%q is not a valid group name: use letters, digits, underscores and dashes, starting with a letter (group = \"qwen\").", r.Group))
		rb.failed = true
		return
	}
	if rc.MaxUnavailable != nil {
		if *rc.MaxUnavailable < 1 {
			l.errorAt(attrRange(b.Body, b.DefRange, "max_unavailable"), "Invalid max_unavailable",
				fmt.Sprintf("max_unavailable is %d; it is how many members of the group may be disrupted at once, at least 1.", *rc.MaxUnavailable))
			rb.failed = true
			return
		}
		r.MaxUnavailable = *rc.MaxUnavailable
	}
	rb.res.Rollout = r
}

// checkRollouts rejects groups whose members disagree on max_unavailable: the limit is
// the group's, and two values would make it depend on which member asks.
func (l *loader) checkRollouts() {
	first := map[string]*Resource{}
	for _, r := range l.plan.Resources {
		if r.Rollout == nil {
			continue
		}
		f, ok := first[r.Rollout.Group]
		if !ok {
			first[r.Rollout.Group] = r
			continue
		}
		if f.Rollout.MaxUnavailable != r.Rollout.MaxUnavailable {
			l.errorAt(r.Rollout.DeclRange, "Conflicting max_unavailable",
				fmt.Sprintf("rollout group %q has max_unavailable = %d here and %d in %s (%s); give every member the same value.",
					r.Rollout.Group, r.Rollout.MaxUnavailable, f.Rollout.MaxUnavailable, f.Addr, f.Rollout.DeclRange))
		}
	}
}

// RolloutGroup is one rollout group of a plan.
type RolloutGroup struct {
	Name           string
	MaxUnavailable int
	// Members are the addresses in the group, in declaration order.
	Members []string
}

// RolloutGroups returns the plan's rollout groups, by name.
func (p *Plan) RolloutGroups() []RolloutGroup {
	idx := map[string]int{}
	var out []RolloutGroup
	for _, r := range p.Resources {
		if r.Rollout == nil {
			continue
		}
		i, ok := idx[r.Rollout.Group]
		if !ok {
			i = len(out)
			idx[r.Rollout.Group] = i
			out = append(out, RolloutGroup{Name: r.Rollout.Group, MaxUnavailable: r.Rollout.MaxUnavailable})
		}
		out[i].Members = append(out[i].Members, r.Addr)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
