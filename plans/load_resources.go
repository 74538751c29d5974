package plans

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/agent-dev/agent/internal/dag"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// collectResources records each resource block, its references and its depends_on.
func (l *loader) collectResources(blocks []*hcl.Block) {
	metaSchema := &hcl.BodySchema{Attributes: []hcl.AttributeSchema{{Name: "depends_on"}}, Blocks: []hcl.BlockHeaderSchema{rolloutSchema}}
	for _, b := range blocks {
		name := b.Labels[0]
		addr := b.Type + "." + name
		if !hclsyntax.ValidIdentifier(name) {
			l.errorAt(b.LabelRanges[0], "Invalid resource name",
				fmt.Sprintf("%q is not a valid name: use letters, digits, underscores and dashes, starting with a letter.", name))
			continue
		}
		if prev, ok := l.resources[addr]; ok {
			l.errorAt(b.DefRange, "Duplicate resource",
				fmt.Sprintf("%s is already declared at %s.", addr, prev.res.DeclRange))
			continue
		}
		meta, remain, diags := b.Body.PartialContent(metaSchema)
		l.diags = append(l.diags, diags...)
		rb := &resourceBlock{
			res:  &Resource{Type: b.Type, Name: name, Addr: addr, Body: remain, DeclRange: b.DefRange, Sensitive: map[string]bool{}, Agent: &l.plan.Agent},
			body: remain,
			refs: bodyTraversals(remain),
		}
		if a, ok := meta.Attributes["depends_on"]; ok {
			exprs, diags := hcl.ExprList(a.Expr)
			l.diags = append(l.diags, diags...)
			for _, e := range exprs {
				t, diags := hcl.AbsTraversalForExpr(e)
				if diags.HasErrors() {
					l.errorAt(e.Range(), "Invalid depends_on entry", "depends_on lists resource addresses, such as [file.nouveau, download.qwen], without quotes.")
					continue
				}
				rb.dependsOn = append(rb.dependsOn, t)
			}
		}
		for _, blk := range meta.Blocks {
			if blk.Type == rolloutSchema.Type {
				rb.rollouts = append(rb.rollouts, blk)
			}
		}
		l.resources[addr] = rb
		l.plan.Resources = append(l.plan.Resources, rb.res)
	}
}

// bodyTraversals returns every variable reference in a native-syntax body, nested blocks
// included. Names bound inside the expression (for-expression iterators) are excluded by
// hclsyntax itself.
func bodyTraversals(body hcl.Body) []hcl.Traversal {
	b, ok := body.(*hclsyntax.Body)
	if !ok {
		return nil
	}
	var out []hcl.Traversal
	names := make([]string, 0, len(b.Attributes))
	for n := range b.Attributes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out = append(out, b.Attributes[n].Expr.Variables()...)
	}
	for _, blk := range b.Blocks {
		out = append(out, bodyTraversals(blk.Body)...)
	}
	return out
}

// decodeResources builds the graph from references, rejects cycles, and decodes each
// resource in dependency order so that its references resolve to decoded values.
func (l *loader) decodeResources() {
	g := &dag.Graph{}
	for _, r := range l.plan.Resources {
		g.Add(r.Addr)
	}
	for _, r := range l.plan.Resources {
		rb := l.resources[r.Addr]
		addDep := func(t hcl.Traversal, dep string) {
			if dep == r.Addr {
				l.errorAt(t.SourceRange(), "Self-reference", fmt.Sprintf("%s refers to itself.", r.Addr))
				rb.failed = true
				return
			}
			if !slices.Contains(r.DependsOn, dep) {
				r.DependsOn = append(r.DependsOn, dep)
			}
			g.Depend(r.Addr, dep)
		}
		for _, t := range rb.refs {
			root := t.RootName()
			switch {
			case root == "var":
				if !l.checkVarRef(t) || l.badVars[varName(t)] {
					rb.unknown = append(rb.unknown, t.SourceRange())
				}
			case root == "local":
				name, ok := attrStep(t, 1)
				if _, declared := l.localExprs[name]; !ok || !declared {
					l.errorAt(t.SourceRange(), "Reference to undeclared local value", fmt.Sprintf("No local value named %q is declared in a locals block.%s", name, suggest(name, slices.Sorted(maps.Keys(l.localExprs)))))
					rb.unknown = append(rb.unknown, t.SourceRange())
				} else if l.badLocals[name] {
					rb.unknown = append(rb.unknown, t.SourceRange())
				}
			case l.opts.Schemas[root] != nil:
				dep, ok := l.resourceRef(t)
				if !ok {
					rb.unknown = append(rb.unknown, t.SourceRange())
					continue
				}
				addDep(t, dep)
			default:
				l.unknownRoot(t)
				rb.unknown = append(rb.unknown, t.SourceRange())
			}
		}
		for _, t := range rb.dependsOn {
			if l.opts.Schemas[t.RootName()] == nil || len(t) != 2 {
				l.errorAt(t.SourceRange(), "Invalid depends_on entry", "depends_on lists resource addresses such as file.nouveau.")
				rb.failed = true
				continue
			}
			dep, ok := l.resourceRef(t)
			if !ok {
				rb.failed = true
				continue
			}
			addDep(t, dep)
		}
	}
	order, err := g.Sort()
	if err != nil {
		var ce *dag.CycleError
		if errorsAs(err, &ce) {
			first := l.resources[ce.Path[0]].res
			l.errorAt(first.DeclRange, "Dependency cycle",
				fmt.Sprintf("These resources depend on each other in a circle: %s. Remove one of the references or depends_on entries.", strings.Join(ce.Path, " → ")))
		}
		return
	}
	for _, addr := range order {
		rb := l.resources[addr]
		if rb.failed {
			continue
		}
		for _, t := range rb.refs {
			if dep, ok := l.refAddr(t); ok && l.resources[dep].res.Value == cty.NilVal {
				// That resource did not decode: what it would give is unknown. Its own
				// errors are reported; this block's are looked for around them.
				rb.unknown = append(rb.unknown, t.SourceRange())
			}
		}
		if rb.unknown != nil {
			l.decodePartial(rb)
			continue
		}
		l.decodeResource(rb)
	}
}

// suggestAttributes adds the closest attribute to HCL's "This object does not have an
// attribute named" about a reference to another resource (download.model.dst: did
// you mean "dest"?).
func (l *loader) suggestAttributes(rb *resourceBlock, diags hcl.Diagnostics) hcl.Diagnostics {
	for _, d := range diags {
		if d.Summary != "Unsupported attribute" || d.Subject == nil || strings.Contains(d.Detail, "Did you mean") {
			continue
		}
		for _, t := range rb.refs {
			dep, ok := l.refAddr(t)
			attr, hasAttr := attrStep(t, 2)
			if !ok || !hasAttr || !t.SourceRange().Overlaps(*d.Subject) {
				continue
			}
			if v := l.resources[dep].res.Value; v != cty.NilVal && v.Type().IsObjectType() {
				d.Detail += suggest(attr, slices.Sorted(maps.Keys(v.Type().AttributeTypes())))
			}
		}
	}
	return diags
}

// refAddr returns the address of the resource a reference names, if it names one.
func (l *loader) refAddr(t hcl.Traversal) (string, bool) {
	if l.opts.Schemas[t.RootName()] == nil {
		return "", false
	}
	name, ok := attrStep(t, 1)
	if !ok {
		return "", false
	}
	addr := t.RootName() + "." + name
	_, ok = l.resources[addr]
	return addr, ok
}

// decodePartial decodes a block some of whose values are unknown (rb.unknown): every
// error that does not concern those values is reported now (an unknown attribute, a
// literal of the wrong type), instead of once the missing values are given. The
// resource gets a partial Config for the kind's own checks (Resource.Unknown) and no
// Value: what refers to it is decoded partially in turn.
func (l *loader) decodePartial(rb *resourceBlock) {
	r := rb.res
	ctx := l.evalContext(false, r.DependsOn...)
	vars := map[string]cty.Value{}
	for n, v := range l.plan.Variables {
		vars[n] = v.Value
	}
	locals := maps.Clone(l.locals)
	for _, t := range rb.refs {
		name, ok := attrStep(t, 1)
		if !ok {
			continue
		}
		switch root := t.RootName(); {
		case root == "var":
			if _, ok := vars[name]; !ok {
				vars[name] = cty.DynamicVal
			}
		case root == "local":
			if _, ok := locals[name]; !ok {
				locals[name] = cty.DynamicVal
			}
		case l.opts.Schemas[root] != nil:
			objs := map[string]cty.Value{}
			if o, ok := ctx.Variables[root]; ok {
				objs = o.AsValueMap()
			}
			if _, ok := objs[name]; !ok {
				objs[name] = cty.DynamicVal
			}
			ctx.Variables[root] = cty.ObjectVal(objs)
		}
	}
	ctx.Variables["var"] = cty.ObjectVal(vars)
	ctx.Variables["local"] = cty.ObjectVal(locals)
	cfg := l.opts.Schemas[r.Type]()
	for _, d := range l.suggestAttributes(rb, gohcl.DecodeBody(rb.body, ctx, cfg)) {
		if Outside(d, rb.unknown) {
			l.diags = append(l.diags, d)
		}
	}
	r.Config, r.Unknown = cfg, rb.unknown
}

// resourceRef checks a type.name... traversal and returns the address it names.
func (l *loader) resourceRef(t hcl.Traversal) (string, bool) {
	name, ok := attrStep(t, 1)
	if !ok {
		l.errorAt(t.SourceRange(), "Invalid reference", fmt.Sprintf("A resource reference looks like %s.NAME.ATTRIBUTE.", t.RootName()))
		return "", false
	}
	addr := t.RootName() + "." + name
	if _, ok := l.resources[addr]; !ok {
		var names []string
		for _, rb := range l.resources {
			if rb.res.Type == t.RootName() {
				names = append(names, rb.res.Name)
			}
		}
		sort.Strings(names)
		l.errorAt(t.SourceRange(), "Reference to undeclared resource",
			fmt.Sprintf("No %s named %q is declared in this plan.%s", t.RootName(), name, suggest(name, names)))
		return "", false
	}
	return addr, true
}

func (l *loader) decodeResource(rb *resourceBlock) {
	r := rb.res
	cfg := l.opts.Schemas[r.Type]()
	ctx := l.evalContext(false, r.DependsOn...)
	diags := l.suggestAttributes(rb, gohcl.DecodeBody(rb.body, ctx, cfg))
	l.diags = append(l.diags, diags...)
	if diags.HasErrors() {
		// Partial: what did decode still gets the kind's own checks (validate reports
		// a bad duration with the misspelt attribute beside it).
		r.Config = cfg
		for _, d := range diags {
			if d.Subject != nil {
				r.Unknown = append(r.Unknown, *d.Subject)
			}
			if d.Context != nil {
				r.Unknown = append(r.Unknown, *d.Context)
			}
			if d.Expression != nil {
				r.Unknown = append(r.Unknown, d.Expression.Range())
			}
		}
		if r.Unknown == nil {
			r.Unknown = []hcl.Range{}
		}
		return
	}
	l.decodeRollout(rb)
	if rb.failed {
		return
	}
	r.Config = cfg
	markSensitive(rb.body, l.evalContext(true, r.DependsOn...), "", r.Sensitive)
	r.Value = resourceValue(rb.body, ctx, r.Name)
}

// markSensitive records the attribute paths whose value derives from a sensitive variable.
// A map or object whose own value is not marked but some of whose elements are (env =
// { HF_TOKEN = var.token, CUDA_VISIBLE_DEVICES = "0,1" }) records those elements alone,
// as KeyPath(attr, key): a secret in one variable must not hide every other one.
func markSensitive(body hcl.Body, ctx *hcl.EvalContext, prefix string, out map[string]bool) {
	b, ok := body.(*hclsyntax.Body)
	if !ok {
		return
	}
	for n, a := range b.Attributes {
		if prefix == "" && n == "depends_on" {
			continue // meta, not configuration (see resourceValue)
		}
		v, diags := a.Expr.Value(ctx)
		if diags.HasErrors() || !v.ContainsMarked() {
			continue
		}
		if keys, ok := markedKeys(v); ok {
			for _, k := range keys {
				out[KeyPath(prefix+n, k)] = true
			}
			continue
		}
		out[prefix+n] = true
	}
	for _, blk := range b.Blocks {
		markSensitive(blk.Body, ctx, prefix+blk.Type+".", out)
	}
}

// markedKeys returns the keys of the elements of a map or object value that carry a mark,
// when the value itself carries none; ok is false for any other value (the whole value is
// then sensitive).
func markedKeys(v cty.Value) (keys []string, ok bool) {
	if v.IsMarked() || !v.IsKnown() || v.IsNull() {
		return nil, false
	}
	if t := v.Type(); !t.IsMapType() && !t.IsObjectType() {
		return nil, false
	}
	for it := v.ElementIterator(); it.Next(); {
		k, ev := it.Element()
		if k.IsMarked() {
			return nil, false
		}
		if ev.ContainsMarked() {
			keys = append(keys, k.AsString())
		}
	}
	return keys, true
}

// resourceValue is what a reference to the resource evaluates to: its attributes as
// written, without depends_on. (hclsyntax keeps the meta attribute in a partial body's
// Attributes; evaluated, a chain of N depends_on nested N resource values in one another,
// and loading grew with N².)
func resourceValue(body hcl.Body, ctx *hcl.EvalContext, name string) cty.Value {
	attrs := map[string]cty.Value{}
	if b, ok := body.(*hclsyntax.Body); ok {
		for n, a := range b.Attributes {
			if n == "depends_on" {
				continue
			}
			if v, diags := a.Expr.Value(ctx); !diags.HasErrors() {
				attrs[n] = v
			}
		}
	}
	if _, ok := attrs["name"]; !ok {
		attrs["name"] = cty.StringVal(name)
	}
	return cty.ObjectVal(attrs)
}
