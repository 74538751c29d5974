package plans

import (
	"fmt"

	"github.com/hashicorp/hcl/v2"
)

// Moved is a `moved { from = server.a  to = server.b }` block: a rename. The agent moves
// the state record of From to To before it observes anything, so the resource keeps its
// record (a server its PID, generation and logs) and nothing is restarted.
type Moved struct {
	From, To  string
	DeclRange hcl.Range
}

var movedSchema = &hcl.BodySchema{Attributes: []hcl.AttributeSchema{
	{Name: "from", Required: true},
	{Name: "to", Required: true},
}}

// decodeMoved reads the moved blocks once the resources are known: To must be a block of
// the plan, From must not be (a rename leaves the old name behind), both of one kind, and
// no address moves twice.
func (l *loader) decodeMoved(blocks []*hcl.Block) {
	from, to := map[string]hcl.Range{}, map[string]hcl.Range{}
	for _, b := range blocks {
		content, diags := b.Body.Content(movedSchema)
		l.diags = append(l.diags, diags...)
		if diags.HasErrors() {
			continue
		}
		addr := func(name string) (string, string, hcl.Range, bool) {
			a := content.Attributes[name]
			t, d := hcl.AbsTraversalForExpr(a.Expr)
			var typ string
			if !d.HasErrors() {
				typ = t.RootName()
			}
			nm, ok := attrStep(t, 1)
			if d.HasErrors() || !ok || len(t) != 2 {
				l.errorAt(a.Expr.Range(), "Invalid moved address", fmt.Sprintf("%s is a resource address such as server.qwen.", name))
				return "", "", a.Expr.Range(), false
			}
			if _, known := l.opts.Schemas[typ]; !known {
				l.errorAt(a.Expr.Range(), "Invalid moved address", fmt.Sprintf("%s: there is no resource kind %q.", name, typ))
				return "", "", a.Expr.Range(), false
			}
			return typ + "." + nm, typ, a.Expr.Range(), true
		}
		f, ft, fr, ok1 := addr("from")
		t, tt, tr, ok2 := addr("to")
		if !ok1 || !ok2 {
			continue
		}
		switch {
		case f == t:
			l.errorAt(tr, "Invalid moved block", "from and to are the same address.")
			continue
		case ft != tt:
			l.errorAt(tr, "Invalid moved block", fmt.Sprintf("%s and %s are of different kinds: a rename keeps the kind.", f, t))
			continue
		case l.resources[t] == nil:
			l.errorAt(tr, "Invalid moved block", fmt.Sprintf("The plan has no %s block to move %s to.", t, f))
			continue
		case l.resources[f] != nil:
			l.errorAt(fr, "Invalid moved block", fmt.Sprintf("%s is still in the plan: a rename removes the old block.", f))
			continue
		}
		if prev, dup := from[f]; dup {
			l.errorAt(fr, "Duplicate moved block", fmt.Sprintf("%s is already moved at %s.", f, prev))
			continue
		}
		if prev, dup := to[t]; dup {
			l.errorAt(tr, "Duplicate moved block", fmt.Sprintf("Something is already moved to %s at %s.", t, prev))
			continue
		}
		from[f], to[t] = fr, tr
		l.plan.Moved = append(l.plan.Moved, Moved{From: f, To: t, DeclRange: b.DefRange})
	}
}
