package plans

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// Plan is a loaded, type-checked plan.
type Plan struct {
	// Dir is the directory the plan was loaded from; relative paths in it (file(),
	// a file resource's source) are resolved against it.
	Dir string
	// Files are the parsed source files by name, for rendering diagnostics.
	Files map[string]*hcl.File
	// Inputs are the absolute paths of every file the plan was loaded from: its plan
	// files, its -var-files (also one that could not be read) and what file() and
	// fileexists() looked at. `agent run` watches them all, wherever they live.
	Inputs []string

	Agent     AgentSettings
	Host      HostSettings
	Variables map[string]*Variable
	// Resources in declaration order (files in name order, blocks in source order).
	Resources []*Resource
	// Moved are the plan's renames (moved blocks), in source order.
	Moved []Moved

	secrets []string
	index   atomic.Pointer[resourceIndex]
}

// Resource returns the resource at addr, or nil. It is a map lookup: the loop asks for
// every resource it publishes, and a scan per call made publishing quadratic in the
// plan's size (issue 27: 2,000 servers pinned 1.8 cores).
func (p *Plan) Resource(addr string) *Resource {
	idx := p.index.Load()
	if idx == nil || idx.n != len(p.Resources) { // built once; again if Resources grew
		idx = &resourceIndex{n: len(p.Resources), m: make(map[string]*Resource, len(p.Resources))}
		for _, r := range p.Resources {
			if _, dup := idx.m[r.Addr]; !dup { // the first one, as the scan found
				idx.m[r.Addr] = r
			}
		}
		p.index.Store(idx)
	}
	return idx.m[addr]
}

// resourceIndex is Resources by address, for the len(Resources) it was built from.
type resourceIndex struct {
	n int
	m map[string]*Resource
}

// Secrets returns the string values of sensitive variables, for redacting output. Output
// paths should prefer the per-attribute Sensitive flags; this is the backstop for logs and
// error messages.
func (p *Plan) Secrets() []string { return p.secrets }

// AgentSettings is the `agent` block: how the agent itself runs on this host.
type AgentSettings struct {
	StateDir      string        // "" when the plan does not say
	Interval      time.Duration // reconcile interval of `agent run`; 0 when not set
	MetricsListen string
	IncusSocket   string
	// Prune lets `agent run` delete orphans (resources recorded in state whose blocks are
	// gone from the plan); without it the loop only reports them.
	Prune bool
	// Coordination is the fleet's etcd (agent { coordination { ... } }); nil: none.
	Coordination *Coordination
}

// HostSettings is the `host` block: guards about which host this plan is for.
type HostSettings struct {
	// Hostname, when set, is the only host the plan may be applied on.
	Hostname  string
	DeclRange hcl.Range
}

// Variable is a declared input variable with its final value.
type Variable struct {
	Name        string
	Description string
	Type        cty.Type
	Sensitive   bool
	Value       cty.Value
	DeclRange   hcl.Range
}

// Resource is one resource block, decoded with its kind's schema.
type Resource struct {
	Type, Name string
	// Addr is "type.name", the resource's address in output, state and --target.
	Addr string
	// Config is the pointer returned by the kind's schema function, filled in.
	Config any
	// DependsOn are the addresses this resource needs applied first: from references in
	// its body and from depends_on, in first-mention order.
	DependsOn []string
	// Rollout is the resource's rollout block (nil when it has none): the group whose
	// disruptive steps the engine limits.
	Rollout *Rollout
	// Body is the resource's body without meta-arguments, for looking up source ranges.
	Body hcl.Body
	// DeclRange is the range of the block header ("server \"qwen\"").
	DeclRange hcl.Range
	// Sensitive holds the attribute paths ("content", "installer.url") whose value
	// derives from a sensitive variable; they are never printed. In a map, only the
	// elements that derive from one are sensitive (`env["HF_TOKEN"]`, see KeyPath and
	// SensitiveKey) unless the whole map does (env = var.secret_env).
	Sensitive map[string]bool
	// Agent is the plan's agent block, for what a kind takes from it at bind (the Incus
	// socket); nil for a resource built without a plan.
	Agent *AgentSettings
	// Value is the resource as other blocks see it through references: its top-level
	// attributes, plus name = the label unless the body sets one.
	Value cty.Value
	// Unknown is set when the plan has errors that left some of this resource's values
	// unknown (a variable without a value, a misspelt reference, an attribute that did
	// not decode): their source ranges. Config is then partial, decoded only so that
	// `agent validate` reports in the same run the errors that do not depend on those
	// values (agent.Bind keeps the kind's OwnValue checks outside these ranges). Such a
	// plan never reaches an engine.
	Unknown []hcl.Range
}

// Partial reports whether r's Config was decoded with some values unknown (Unknown).
func (r *Resource) Partial() bool { return r.Unknown != nil }

// OwnValue marks a kind's diagnostic (hcl.Diagnostic.Extra) as a check of one
// attribute's own value (a duration that does not parse, a port out of range): it holds
// whatever the rest of the plan says, so it is reported for a Partial resource too.
var OwnValue = ownValue{}

type ownValue struct{}

// Outside reports whether d points at none of the ranges: it is not about a value
// that some other error left unknown.
func Outside(d *hcl.Diagnostic, ranges []hcl.Range) bool {
	for _, u := range ranges {
		if d.Subject != nil && d.Subject.Overlaps(u) {
			return false
		}
		if d.Context != nil && d.Context.Overlaps(u) {
			return false // gohcl's conversion errors: Subject is where the expression starts
		}
		if d.Expression != nil && d.Expression.Range().Overlaps(u) {
			return false
		}
	}
	return true
}

// KeyPath is the path of one element of a map attribute, as diffs name it:
// KeyPath("env", "HF_TOKEN") is `env["HF_TOKEN"]`.
func KeyPath(attr, key string) string { return fmt.Sprintf("%s[%q]", attr, key) }

// SensitiveKey reports whether the element key of the map attribute attr derives from a
// sensitive variable: the element itself, or the whole map.
func (r *Resource) SensitiveKey(attr, key string) bool {
	return r.Sensitive[attr] || r.Sensitive[KeyPath(attr, key)]
}

// SensitiveAny reports whether any part of attr derives from a sensitive variable: the
// whole attribute or one of its elements (a rendered command line that holds a secret
// flag is sensitive as a whole).
func (r *Resource) SensitiveAny(attr string) bool {
	if r.Sensitive[attr] {
		return true
	}
	prefix := attr + "["
	for p := range r.Sensitive {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

// Dir is the directory of the file that declares the resource.
func (r *Resource) Dir() string { return filepath.Dir(r.DeclRange.Filename) }

// Range returns the source range of an attribute, following nested block types:
// Range("ready", "timeout") is the timeout attribute of the ready block. It falls back to
// the closest enclosing block, then to the resource header, so a diagnostic always points
// somewhere useful.
func (r *Resource) Range(path ...string) hcl.Range {
	return attrRange(r.Body, r.DeclRange, path...)
}

func attrRange(body hcl.Body, fallback hcl.Range, path ...string) hcl.Range {
	b, ok := body.(*hclsyntax.Body)
	if !ok {
		return fallback
	}
	for i, name := range path {
		last := i == len(path)-1
		if last {
			if a, ok := b.Attributes[name]; ok {
				return a.SrcRange
			}
		}
		found := false
		for _, blk := range b.Blocks {
			if blk.Type == name {
				if last {
					return blk.DefRange()
				}
				b, fallback, found = blk.Body, blk.DefRange(), true
				break
			}
		}
		if !found {
			return fallback
		}
	}
	return fallback
}
