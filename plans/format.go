package plans

import (
	"bytes"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
)

// Format returns src in canonical form (hclwrite's layout: aligned equals signs, two-space
// indents). It refuses source that does not parse, so formatting never hides a syntax error.
func Format(name string, src []byte) ([]byte, hcl.Diagnostics) {
	if diags := checkBounds(name, src); diags.HasErrors() {
		return nil, diags
	}
	if _, diags := hclsyntax.ParseConfig(src, name, hcl.InitialPos); diags.HasErrors() {
		return nil, diags
	}
	out := hclwrite.Format(src)
	if len(out) > 0 && !bytes.HasSuffix(out, []byte("\n")) {
		out = append(out, '\n')
	}
	return out, nil
}
