package plans

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/zclconf/go-cty/cty"

	"github.com/agent-dev/agent/internal/dag"
)

// Options are what a plan is loaded with besides its source.
type Options struct {
	// Schemas maps each resource kind ("file", "server") to a function returning a new
	// pointer to its configuration struct (gohcl tags). Block types not named here are
	// an error.
	Schemas map[string]func() any
	// Vars are -var arguments, "name=value", in command-line order.
	Vars []string
	// VarFiles are -var-file paths, in command-line order.
	VarFiles []string
	// Environ is the process environment (os.Environ()), for AGENT_VAR_name.
	Environ []string
}

// VarFileSuffix marks variable files: in a plan directory they are not plan files, and
// are read only through -var-file (kpro5.vars.hcl).
const VarFileSuffix = ".vars.hcl"

// MaxFileSize bounds a plan file: plans are tens of lines; a huge file is an accident or
// an attack, and the parser's memory grows with it.
const MaxFileSize = 4 << 20

// Load reads the plan at path (a *.hcl file, or a directory whose *.hcl files form one
// plan) and type-checks it. The returned diagnostics hold every error found; the plan is
// usable only when they have no errors.
func Load(path string, opts Options) (*Plan, hcl.Diagnostics) {
	sources, dir, err := readSources(path)
	if err != nil {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot read plan", Detail: err.Error()}}
	}
	p, diags := LoadSources(dir, sources, opts)
	// The plan files come first among its inputs, in read order.
	inputs := p.Inputs
	p.Inputs = nil
	for _, s := range sources {
		p.addInput(s.Name)
	}
	for _, in := range inputs {
		p.addInput(in)
	}
	return p, diags
}

// Source is one plan file's name and content.
type Source struct {
	Name string
	Data []byte
}

func readSources(path string) ([]Source, string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, "", err
	}
	euid := os.Geteuid()
	if err := CheckOwnership(path, euid, st.IsDir()); err != nil {
		return nil, "", err
	}
	var names []string
	dir := filepath.Dir(path)
	if st.IsDir() {
		dir = path
		all, err := filepath.Glob(filepath.Join(path, "*.hcl"))
		if err != nil {
			return nil, "", err
		}
		// *.vars.hcl beside the plan are variable files (one per host): they are read
		// only when named with -var-file, never as part of the plan.
		for _, n := range all {
			if !strings.HasSuffix(n, VarFileSuffix) {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return nil, "", fmt.Errorf("%s holds no *.hcl plan files (*%s are variable files, for -var-file)", path, VarFileSuffix)
		}
		sort.Strings(names)
	} else {
		names = []string{path}
	}
	var out []Source
	for _, n := range names {
		if st.IsDir() {
			if err := CheckOwnership(n, euid, true); err != nil {
				return nil, "", err
			}
		}
		data, err := readInput(n, MaxFileSize)
		if err != nil {
			return nil, "", err
		}
		out = append(out, Source{Name: n, Data: data})
	}
	return out, dir, nil
}

// rootSchema is the top level; resource kinds are added per load.
func rootSchema(kinds []string) *hcl.BodySchema {
	s := &hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "agent"},
		{Type: "host"},
		{Type: "variable", LabelNames: []string{"name"}},
		{Type: "locals"},
		{Type: "moved"},
	}}
	for _, k := range kinds {
		s.Blocks = append(s.Blocks, hcl.BlockHeaderSchema{Type: k, LabelNames: []string{"name"}})
	}
	return s
}

type loader struct {
	opts   Options
	plan   *Plan
	diags  hcl.Diagnostics
	locals map[string]cty.Value
	// localExprs keeps each local's expression for ordered evaluation.
	localExprs map[string]*hcl.Attribute
	resources  map[string]*resourceBlock
	funcs      map[string]funcEntry
	// badVars and badLocals have errors already reported; what uses them is not decoded,
	// so that one mistake is reported once.
	badVars, badLocals map[string]bool
	// varObj and localObj cache the `var` and `local` objects of evalContext once final;
	// localsDone says the locals are.
	varObj     map[bool]cty.Value
	localObj   cty.Value
	localsDone bool
}

type resourceBlock struct {
	res       *Resource
	body      hcl.Body
	refs      []hcl.Traversal
	dependsOn []hcl.Traversal
	rollouts  []*hcl.Block
	failed    bool
	// unknown are the references whose value an error reported elsewhere left unknown
	// (a variable without a value, an undeclared local, a resource that failed): the
	// block is then decoded partially, for the errors that do not depend on them.
	unknown []hcl.Range
}

// LoadSources is Load over sources already in memory; dir resolves relative paths. The
// parser's fuzz target calls it directly.
func LoadSources(dir string, sources []Source, opts Options) (*Plan, hcl.Diagnostics) {
	l := &loader{
		opts:       opts,
		plan:       &Plan{Dir: dir, Files: map[string]*hcl.File{}, Variables: map[string]*Variable{}},
		locals:     map[string]cty.Value{},
		localExprs: map[string]*hcl.Attribute{},
		resources:  map[string]*resourceBlock{},
		badVars:    map[string]bool{},
		badLocals:  map[string]bool{},
	}
	l.funcs = functions(dir, l.plan.addInput)
	var files []*hcl.File
	for _, s := range sources {
		if diags := checkBounds(s.Name, s.Data); diags.HasErrors() {
			l.diags = append(l.diags, diags...)
			continue
		}
		f, diags := parseFile(s.Data, s.Name)
		l.diags = append(l.diags, diags...)
		if f != nil {
			l.plan.Files[s.Name] = f
			files = append(files, f)
		}
	}
	if l.diags.HasErrors() {
		return l.plan, l.diags
	}
	kinds := make([]string, 0, len(opts.Schemas))
	for k := range opts.Schemas {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)

	var content []*hcl.BodyContent
	for _, f := range files {
		c, diags := f.Body.Content(rootSchema(kinds))
		l.diags = append(l.diags, diags...)
		content = append(content, c)
	}
	var varBlocks, localBlocks, resBlocks, movedBlocks []*hcl.Block
	var agentBlock, hostBlock *hcl.Block
	for _, c := range content {
		for _, b := range c.Blocks {
			switch b.Type {
			case "variable":
				varBlocks = append(varBlocks, b)
			case "locals":
				localBlocks = append(localBlocks, b)
			case "agent":
				agentBlock = l.single(agentBlock, b)
			case "host":
				hostBlock = l.single(hostBlock, b)
			case "moved":
				movedBlocks = append(movedBlocks, b)
			default:
				resBlocks = append(resBlocks, b)
			}
		}
	}
	l.variables(varBlocks)
	l.collectLocals(localBlocks)
	l.collectResources(resBlocks)
	l.evalLocals()
	l.decodeAgent(agentBlock)
	l.decodeHost(hostBlock)
	l.decodeResources()
	l.checkRollouts()
	l.decodeMoved(movedBlocks)
	sortDiagnostics(l.diags)
	return l.plan, l.diags
}

// SortDiagnostics orders diagnostics as Load does (by position), for callers that add
// their own (agent.Bind's).
func SortDiagnostics(diags hcl.Diagnostics) { sortDiagnostics(diags) }

// sortDiagnostics orders diagnostics by position (those without one first), so output
// reads top to bottom whatever order the phases found them in.
func sortDiagnostics(diags hcl.Diagnostics) {
	key := func(d *hcl.Diagnostic) (string, int, int) {
		if d.Subject == nil {
			return "", 0, 0
		}
		return d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column
	}
	sort.SliceStable(diags, func(i, j int) bool {
		fi, li, ci := key(diags[i])
		fj, lj, cj := key(diags[j])
		if fi != fj {
			return fi < fj
		}
		if li != lj {
			return li < lj
		}
		return ci < cj
	})
}

func (l *loader) single(prev, b *hcl.Block) *hcl.Block {
	if prev != nil {
		l.diags = append(l.diags, &hcl.Diagnostic{
			Severity: hcl.DiagError,
			Summary:  fmt.Sprintf("Duplicate %s block", b.Type),
			Detail:   fmt.Sprintf("A plan has at most one %s block; the first is at %s.", b.Type, prev.DefRange),
			Subject:  b.DefRange.Ptr(),
		})
		return prev
	}
	return b
}

// evalContext returns the context expressions are evaluated in: variables, locals,
// functions, and the decoded values of the resources in deps. With marked, sensitive
// variable values carry a mark, so that an expression's result tells whether it derives
// from a secret.
//
// A block may refer only to the resources it depends on (every reference became an edge
// of the graph), so the context holds those alone: with every resource in every context,
// loading a plan of N resources built N objects of N values, and 8,000 resources took
// 37 s. The variable and local objects are final by the time resources are decoded and
// are built once.
func (l *loader) evalContext(marked bool, deps ...string) *hcl.EvalContext {
	ctxVars := map[string]cty.Value{
		"var":   l.varObject(marked),
		"local": l.localObject(),
	}
	byKind := map[string]map[string]cty.Value{}
	for _, addr := range deps {
		rb := l.resources[addr]
		if rb == nil || rb.res.Value == cty.NilVal {
			continue
		}
		if byKind[rb.res.Type] == nil {
			byKind[rb.res.Type] = map[string]cty.Value{}
		}
		byKind[rb.res.Type][rb.res.Name] = rb.res.Value
	}
	for k, m := range byKind {
		ctxVars[k] = cty.ObjectVal(m)
	}
	return &hcl.EvalContext{Variables: ctxVars, Functions: l.funcTable()}
}

// varObject is the `var` object, built once: variables are final before any expression
// that may use them is evaluated.
func (l *loader) varObject(marked bool) cty.Value {
	if v, ok := l.varObj[marked]; ok {
		return v
	}
	vars := map[string]cty.Value{}
	for name, v := range l.plan.Variables {
		val := v.Value
		if marked && v.Sensitive {
			val = val.Mark(sensitiveMark)
		}
		vars[name] = val
	}
	obj := cty.ObjectVal(vars)
	if l.varObj == nil {
		l.varObj = map[bool]cty.Value{}
	}
	l.varObj[marked] = obj
	return obj
}

// localObject is the `local` object: while locals are evaluated, the values so far (a
// local's context holds only the locals it depends on, see evalLocals); afterwards, built
// once.
func (l *loader) localObject() cty.Value {
	if l.localObj != cty.NilVal {
		return l.localObj
	}
	obj := cty.ObjectVal(l.locals)
	if l.localsDone {
		l.localObj = obj
	}
	return obj
}

const sensitiveMark = "sensitive"

// collectLocals gathers the attributes of every locals block.
func (l *loader) collectLocals(blocks []*hcl.Block) {
	for _, b := range blocks {
		attrs, diags := b.Body.JustAttributes()
		l.diags = append(l.diags, diags...)
		names := make([]string, 0, len(attrs))
		for n := range attrs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			a := attrs[n]
			if prev, ok := l.localExprs[n]; ok {
				l.diags = append(l.diags, &hcl.Diagnostic{
					Severity: hcl.DiagError,
					Summary:  "Duplicate local value",
					Detail:   fmt.Sprintf("local.%s is already defined at %s.", n, prev.NameRange),
					Subject:  a.NameRange.Ptr(),
				})
				continue
			}
			l.localExprs[n] = a
		}
	}
}

// evalLocals evaluates locals in dependency order. Locals may use variables, other locals
// and functions, not resources: a value that depends on a resource belongs in that
// resource's reference, where it also orders the apply.
func (l *loader) evalLocals() {
	g := &dag.Graph{}
	names := make([]string, 0, len(l.localExprs))
	for n := range l.localExprs {
		names = append(names, n)
	}
	sort.Strings(names)
	bad := map[string]bool{}
	for _, n := range names {
		g.Add(n)
		for _, t := range l.localExprs[n].Expr.Variables() {
			root := t.RootName()
			switch {
			case root == "var":
				if !l.checkVarRef(t) || l.badVars[varName(t)] {
					bad[n] = true
				}
			case root == "local":
				name, ok := attrStep(t, 1)
				if !ok {
					l.errorAt(t.SourceRange(), "Invalid reference", "A local value reference looks like local.NAME.")
					bad[n] = true
					continue
				}
				if _, ok := l.localExprs[name]; !ok {
					l.errorAt(t.SourceRange(), "Reference to undeclared local value", fmt.Sprintf("No local value named %q is declared in a locals block.", name))
					bad[n] = true
					continue
				}
				g.Depend(n, name)
			case l.opts.Schemas[root] != nil:
				l.errorAt(t.SourceRange(), "Resource reference in locals",
					fmt.Sprintf("local.%s refers to %s; locals may use only var.*, local.* and functions. Refer to the resource directly where its value is needed.", n, traversalString(t)))
				bad[n] = true
			default:
				l.unknownRoot(t)
				bad[n] = true
			}
		}
	}
	order, err := g.Sort()
	if err != nil {
		var ce *dag.CycleError
		if errorsAs(err, &ce) {
			path := make([]string, len(ce.Path))
			for i, p := range ce.Path {
				path[i] = "local." + p
			}
			l.errorAt(l.localExprs[ce.Path[0]].NameRange, "Dependency cycle in locals", strings.Join(path, " → "))
		}
		return
	}
	for _, n := range order {
		a := l.localExprs[n]
		if bad[n] || slices.ContainsFunc(g.Deps(n), func(d string) bool { return bad[d] }) {
			bad[n] = true
			l.badLocals[n] = true
			l.locals[n] = cty.DynamicVal
			continue
		}
		v, diags := a.Expr.Value(l.localContext(g.Deps(n)))
		l.diags = append(l.diags, diags...)
		if diags.HasErrors() {
			l.badLocals[n] = true
			bad[n] = true
			v = cty.DynamicVal
		}
		l.locals[n] = v
	}
	for n := range bad {
		l.badLocals[n] = true
	}
	l.localsDone = true
}

// localContext is the context of one local's expression: variables, functions and the
// locals it depends on (built per local, so that many locals load in linear time).
func (l *loader) localContext(deps []string) *hcl.EvalContext {
	locals := make(map[string]cty.Value, len(deps))
	for _, d := range deps {
		locals[d] = l.locals[d]
	}
	return &hcl.EvalContext{
		Variables: map[string]cty.Value{"var": l.varObject(false), "local": cty.ObjectVal(locals)},
		Functions: l.funcTable(),
	}
}

func varName(t hcl.Traversal) string { n, _ := attrStep(t, 1); return n }

func (l *loader) errorAt(rng hcl.Range, summary, detail string) {
	l.diags = append(l.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr()})
}

// checkVarRef reports whether a var.* traversal names a declared variable.
func (l *loader) checkVarRef(t hcl.Traversal) bool {
	name, ok := attrStep(t, 1)
	if !ok {
		l.errorAt(t.SourceRange(), "Invalid reference", "A variable reference looks like var.NAME.")
		return false
	}
	if _, ok := l.plan.Variables[name]; !ok {
		l.errorAt(t.SourceRange(), "Reference to undeclared input variable",
			fmt.Sprintf("No variable named %q is declared.%s Declare it with a variable %q {} block.", name, suggest(name, slices.Sorted(maps.Keys(l.plan.Variables))), name))
		return false
	}
	return true
}

func (l *loader) unknownRoot(t hcl.Traversal) {
	kinds := make([]string, 0, len(l.opts.Schemas))
	for k := range l.opts.Schemas {
		kinds = append(kinds, k+".")
	}
	sort.Strings(kinds)
	l.errorAt(t.SourceRange(), "Unknown reference",
		fmt.Sprintf("%q is not something a plan can refer to. References start with var., local., or a resource type (%s).", t.RootName(), strings.Join(kinds, ", ")))
}

// attrStep returns the name of the attribute step at index i of t.
func attrStep(t hcl.Traversal, i int) (string, bool) {
	if len(t) <= i {
		return "", false
	}
	if a, ok := t[i].(hcl.TraverseAttr); ok {
		return a.Name, true
	}
	return "", false
}

func traversalString(t hcl.Traversal) string {
	var b strings.Builder
	for _, s := range t {
		switch s := s.(type) {
		case hcl.TraverseRoot:
			b.WriteString(s.Name)
		case hcl.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			b.WriteString("[…]")
		}
	}
	return b.String()
}

type agentBlock struct {
	StateDir      *string `hcl:"state_dir,optional"`
	Interval      *string `hcl:"interval,optional"`
	MetricsListen *string `hcl:"metrics_listen,optional"`
	IncusSocket   *string `hcl:"incus_socket,optional"`
	Prune         *bool   `hcl:"prune,optional"`
}

func (l *loader) decodeAgent(b *hcl.Block) {
	if b == nil {
		return
	}
	inner, rest, diags := b.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "coordination"}}})
	l.diags = append(l.diags, diags...)
	l.decodeCoordination(inner.Blocks)
	var a agentBlock
	diags = gohcl.DecodeBody(rest, l.evalContext(false), &a)
	l.diags = append(l.diags, diags...)
	if diags.HasErrors() {
		return
	}
	s := &l.plan.Agent
	s.StateDir = deref(a.StateDir)
	s.MetricsListen = deref(a.MetricsListen)
	s.IncusSocket = deref(a.IncusSocket)
	s.Prune = deref(a.Prune)
	if a.Interval != nil {
		d, err := time.ParseDuration(*a.Interval)
		if err != nil || d <= 0 {
			l.errorAt(attrRange(b.Body, b.DefRange, "interval"), "Invalid interval",
				fmt.Sprintf("%q is not a positive duration; write it like \"30s\" or \"5m\".", *a.Interval))
		}
		s.Interval = d
	}
}

type hostBlock struct {
	Hostname *string `hcl:"hostname,optional"`
}

func (l *loader) decodeHost(b *hcl.Block) {
	if b == nil {
		return
	}
	var h hostBlock
	diags := gohcl.DecodeBody(b.Body, l.evalContext(false), &h)
	l.diags = append(l.diags, diags...)
	l.plan.Host = HostSettings{Hostname: deref(h.Hostname), DeclRange: b.DefRange}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
