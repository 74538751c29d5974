// Package file is the `file` resource kind: a regular file on the host (resources.File),
// bound from its block.
package file

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
	"github.com/hashicorp/hcl/v2"
)

// FileConfig is the `file` block.
type FileConfig struct {
	Path      string  `hcl:"path"`
	Content   *string `hcl:"content,optional"`
	Source    *string `hcl:"source,optional"`
	Mode      *string `hcl:"mode,optional"`
	Owner     *string `hcl:"owner,optional"`
	Group     *string `hcl:"group,optional"`
	Ensure    *string `hcl:"ensure,optional"`
	Sensitive *bool   `hcl:"sensitive,optional"`
}

// FileKind is the `file` resource kind.
func FileKind() agent.Kind {
	return agent.NewKind("file", bindFile)
}

func bindFile(r *plans.Resource, c *FileConfig) (agent.Resource, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	bad := func(attr, summary, detail string) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: r.Range(attr).Ptr()})
	}
	f := resources.FileSpec{Addr: r.Addr, Path: c.Path, Owner: resources.Deref(c.Owner), Group: resources.Deref(c.Group)}
	f.Sensitive = resources.Deref(c.Sensitive) || r.Sensitive["content"] || r.Sensitive["source"]
	if !filepath.IsAbs(c.Path) {
		bad("path", "Relative file path", fmt.Sprintf("path %q must be absolute: the agent's working directory is not part of the plan.", c.Path))
	} else if filepath.Clean(c.Path) != c.Path {
		bad("path", "Unclean file path", fmt.Sprintf("write path as %q.", filepath.Clean(c.Path)))
	}
	switch e := resources.Deref(c.Ensure); e {
	case "", "present":
	case "absent":
		f.Absent = true
	default:
		bad("ensure", "Invalid ensure", fmt.Sprintf("ensure is \"present\" or \"absent\", not %q.", e))
	}
	switch {
	case f.Absent && (c.Content != nil || c.Source != nil):
		bad("ensure", "Content for an absent file", "An absent file has no content or source; remove them or ensure = \"present\".")
	case !f.Absent && c.Content != nil && c.Source != nil:
		bad("source", "Both content and source", "Give the file's content inline (content) or from a local file (source), not both.")
	case !f.Absent && c.Content == nil && c.Source == nil:
		bad("path", "No content", "A file needs content = \"…\" or source = \"local/path\" (or ensure = \"absent\").")
	case c.Content != nil:
		f.Content = []byte(*c.Content)
	case c.Source != nil:
		f.Source = *c.Source
		if !filepath.IsAbs(f.Source) {
			f.Source = filepath.Join(r.Dir(), f.Source)
		}
	}
	if c.Mode != nil {
		m, err := strconv.ParseUint(*c.Mode, 8, 32)
		if err != nil || m > 0o7777 {
			bad("mode", "Invalid mode", fmt.Sprintf("mode %q is not an octal permission such as \"0644\".", *c.Mode))
		} else {
			fm := resources.OctalMode(uint32(m))
			f.Mode = &fm
		}
	}
	if diags.HasErrors() {
		return nil, diags
	}
	return resources.NewFile(f), nil
}
