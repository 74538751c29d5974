package plans

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// EnvPrefix is the prefix of environment variables that set plan variables:
// AGENT_VAR_model_root=/srv/models sets var.model_root.
const EnvPrefix = "AGENT_VAR_"

var variableSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "type"},
		{Name: "default"},
		{Name: "description"},
		{Name: "sensitive"},
	},
	Blocks: []hcl.BlockHeaderSchema{{Type: "validation"}},
}

type validation struct {
	Condition    hcl.Expression `hcl:"condition"`
	ErrorMessage string         `hcl:"error_message"`
}

type declared struct {
	v           *Variable
	def         *hcl.Attribute
	defaults    *typeexpr.Defaults
	validations []validation
	valueRange  hcl.Range
	set         bool
	failed      bool // a value was given but was invalid: already reported
}

// variables declares each variable block and assigns its value. Precedence, lowest first:
// default, AGENT_VAR_name, -var-file (in order), -var (in order).
func (l *loader) variables(blocks []*hcl.Block) {
	decls := map[string]*declared{}
	var order []string
	for _, b := range blocks {
		name := b.Labels[0]
		if !hclsyntax.ValidIdentifier(name) {
			l.errorAt(b.LabelRanges[0], "Invalid variable name", fmt.Sprintf("%q is not a valid identifier.", name))
			continue
		}
		if prev, ok := decls[name]; ok {
			l.errorAt(b.DefRange, "Duplicate variable", fmt.Sprintf("var.%s is already declared at %s.", name, prev.v.DeclRange))
			continue
		}
		c, diags := b.Body.Content(variableSchema)
		l.diags = append(l.diags, diags...)
		d := &declared{v: &Variable{Name: name, Type: cty.DynamicPseudoType, DeclRange: b.DefRange}}
		if a, ok := c.Attributes["type"]; ok {
			ty, defaults, diags := typeexpr.TypeConstraintWithDefaults(a.Expr)
			l.diags = append(l.diags, diags...)
			if !diags.HasErrors() {
				d.v.Type, d.defaults = ty, defaults
			}
		}
		if a, ok := c.Attributes["description"]; ok {
			l.diags = append(l.diags, gohcl.DecodeExpression(a.Expr, nil, &d.v.Description)...)
		}
		if a, ok := c.Attributes["sensitive"]; ok {
			l.diags = append(l.diags, gohcl.DecodeExpression(a.Expr, nil, &d.v.Sensitive)...)
		}
		if a, ok := c.Attributes["default"]; ok {
			d.def = a
		}
		for _, vb := range c.Blocks {
			var v validation
			l.diags = append(l.diags, gohcl.DecodeBody(vb.Body, nil, &v)...)
			if v.Condition != nil {
				d.validations = append(d.validations, v)
			}
		}
		decls[name] = d
		order = append(order, name)
		l.plan.Variables[name] = d.v
	}

	// Defaults: constant expressions, functions allowed.
	for _, name := range order {
		d := decls[name]
		if d.def == nil {
			continue
		}
		val, diags := d.def.Expr.Value(&hcl.EvalContext{Functions: l.funcTable()})
		l.diags = append(l.diags, diags...)
		if !diags.HasErrors() {
			l.assign(d, val, d.def.Expr.Range())
		}
	}
	// AGENT_VAR_name from the environment.
	for _, kv := range l.opts.Environ {
		k, raw, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, EnvPrefix) {
			continue
		}
		name := strings.TrimPrefix(k, EnvPrefix)
		d, ok := decls[name]
		if !ok {
			continue // the environment is shared; a variable of another plan is not an error
		}
		l.assignRaw(d, raw, hcl.Range{Filename: "<environment " + k + ">"})
	}
	// -var-file FILE: attributes only.
	for _, path := range l.opts.VarFiles {
		l.varFile(decls, path)
	}
	// -var name=value.
	for _, arg := range l.opts.Vars {
		name, raw, ok := strings.Cut(arg, "=")
		rng := hcl.Range{Filename: "<-var " + name + ">"}
		if !ok {
			l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid -var argument",
				Detail: fmt.Sprintf("-var %q: write it as -var name=value.", arg)})
			continue
		}
		d, ok := decls[name]
		if !ok {
			l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Value for undeclared variable",
				Detail: fmt.Sprintf("-var sets %q, but the plan declares no variable %q.%s", name, name, suggest(name, order))})
			continue
		}
		l.assignRaw(d, raw, rng)
	}

	for _, name := range order {
		d := decls[name]
		if d.failed {
			l.badVars[name] = true
			d.v.Value = cty.DynamicVal
			continue
		}
		if !d.set {
			l.badVars[name] = true
			l.errorAt(d.v.DeclRange, "No value for required variable",
				fmt.Sprintf("var.%s has no default. Set it with -var %s=VALUE, a -var-file, or %s%s in the environment.", name, name, EnvPrefix, name))
			d.v.Value = cty.DynamicVal
			continue
		}
		if !l.validate(d) {
			l.badVars[name] = true
		}
		if d.v.Sensitive {
			l.plan.secrets = append(l.plan.secrets, secretStrings(d.v.Value)...)
		}
	}
}

// assignRaw sets a variable from a command-line or environment string: string variables
// take it verbatim, others parse it as an HCL expression (as Terraform does).
func (l *loader) assignRaw(d *declared, raw string, rng hcl.Range) {
	if d.v.Type == cty.String || d.v.Type == cty.DynamicPseudoType {
		l.assign(d, cty.StringVal(raw), rng)
		return
	}
	if diags := checkBounds(rng.Filename, []byte(raw)); diags.HasErrors() {
		d.failed = true
		for _, diag := range diags {
			diag.Subject = nil // the place is the -var or environment value, not a file
			diag.Detail = fmt.Sprintf("var.%s (%s): %s", d.v.Name, rng.Filename, diag.Detail)
		}
		l.diags = append(l.diags, diags...)
		return
	}
	expr, diags := hclsyntax.ParseExpression([]byte(raw), rng.Filename, hcl.InitialPos)
	if !diags.HasErrors() {
		var v cty.Value
		v, diags = expr.Value(&hcl.EvalContext{Functions: l.funcTable()})
		if !diags.HasErrors() {
			l.assign(d, v, rng)
			return
		}
	}
	d.failed = true
	l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid value for variable",
		Detail: fmt.Sprintf("%s: var.%s is a %s; %q is not a valid expression of that type.", rng.Filename, d.v.Name, typeexpr.TypeString(d.v.Type), raw)})
}

func (l *loader) assign(d *declared, val cty.Value, rng hcl.Range) {
	if d.defaults != nil {
		val = d.defaults.Apply(val)
	}
	conv, err := convert.Convert(val, d.v.Type)
	if err != nil {
		d.failed = true
		l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid value for variable",
			Detail:  fmt.Sprintf("var.%s must be %s: %s.", d.v.Name, typeexpr.TypeString(d.v.Type), err),
			Subject: subject(rng)})
		return
	}
	d.v.Value, d.valueRange, d.set = conv, rng, true
}

func subject(rng hcl.Range) *hcl.Range {
	if rng.Start.Line == 0 {
		return nil
	}
	return rng.Ptr()
}

func (l *loader) varFile(decls map[string]*declared, path string) {
	l.plan.addInput(path) // watched even while it cannot be read: its return is a change
	data, err := readVarFile(path)
	if err != nil {
		l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot read variable file", Detail: err.Error()})
		return
	}
	if diags := checkBounds(path, data); diags.HasErrors() {
		l.diags = append(l.diags, diags...)
		return
	}
	f, diags := hclsyntax.ParseConfig(data, path, hcl.InitialPos)
	l.diags = append(l.diags, diags...)
	if diags.HasErrors() {
		return
	}
	l.plan.Files[path] = f
	attrs, diags := f.Body.JustAttributes()
	l.diags = append(l.diags, diags...)
	names := make([]string, 0, len(attrs))
	for n := range attrs {
		names = append(names, n)
	}
	sort.Strings(names)
	declaredNames := make([]string, 0, len(decls))
	for n := range decls {
		declaredNames = append(declaredNames, n)
	}
	for _, n := range names {
		a := attrs[n]
		d, ok := decls[n]
		if !ok {
			l.errorAt(a.NameRange, "Value for undeclared variable",
				fmt.Sprintf("The plan declares no variable %q.%s", n, suggest(n, declaredNames)))
			continue
		}
		v, diags := a.Expr.Value(&hcl.EvalContext{Functions: l.funcTable()})
		l.diags = append(l.diags, diags...)
		if !diags.HasErrors() {
			l.assign(d, v, a.Expr.Range())
		}
	}
}

// validate runs the variable's validation blocks with only var.<name> in scope, and
// reports whether the value passed them all.
func (l *loader) validate(d *declared) bool {
	ok := true
	ctx := &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": cty.ObjectVal(map[string]cty.Value{d.v.Name: d.v.Value})},
		Functions: l.funcTable(),
	}
	for _, v := range d.validations {
		for _, t := range v.Condition.Variables() {
			if n, _ := attrStep(t, 1); t.RootName() != "var" || n != d.v.Name {
				l.errorAt(t.SourceRange(), "Invalid validation condition", fmt.Sprintf("The condition of var.%s may refer only to var.%s.", d.v.Name, d.v.Name))
				return false
			}
		}
		res, diags := v.Condition.Value(ctx)
		l.diags = append(l.diags, diags...)
		if diags.HasErrors() {
			ok = false
			continue
		}
		if res.IsNull() || !res.IsKnown() || res.Type() != cty.Bool {
			l.errorAt(v.Condition.Range(), "Invalid validation condition", "The condition must be true or false.")
			ok = false
			continue
		}
		if res.False() {
			ok = false
			msg := v.ErrorMessage
			if d.v.Sensitive {
				msg += " (the value is sensitive and not shown)"
			}
			l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid value for variable",
				Detail: fmt.Sprintf("var.%s: %s", d.v.Name, msg), Subject: subject(d.valueRange), Context: v.Condition.Range().Ptr()})
		}
	}
	return ok
}

// secretStrings flattens a value into the strings that must never be printed.
func secretStrings(v cty.Value) []string {
	if v.IsNull() || !v.IsKnown() {
		return nil
	}
	switch {
	case v.Type() == cty.String:
		if s := v.AsString(); len(s) >= 4 { // shorter values would redact ordinary text
			return []string{s}
		}
	case v.Type().IsPrimitiveType():
		return nil
	case v.CanIterateElements():
		var out []string
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			out = append(out, secretStrings(e)...)
		}
		return out
	}
	return nil
}

// suggest returns " Did you mean "x"?" for the closest name, or "".
func suggest(name string, names []string) string {
	best := Closest(name, names)
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" Did you mean %q?", best)
}

// Closest returns the name of names closest to name (at most two edits away), or "":
// the suggestion for a misspelt variable, reference, command or flag.
func Closest(name string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := levenshtein(name, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = slices.Min([]int{prev[j] + 1, cur[j-1] + 1, prev[j-1] + cost})
		}
		prev = cur
	}
	return prev[len(b)]
}

// readVarFile reads a -var-file under the same rules as a plan file: StrictModes when
// running as root, and MaxFileSize.
func readVarFile(path string) ([]byte, error) {
	if err := CheckOwnership(path, os.Geteuid(), false); err != nil {
		return nil, err
	}
	return readInput(path, MaxFileSize)
}
