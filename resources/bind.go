package resources

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/plans"
)

// Binder collects the diagnostics of one block's bind: what types cannot say (an
// absolute path, a positive duration, one of two values), each pointing into the plan.
// A kind's bind function fills its resource through it and returns its diagnostics.
type Binder struct {
	R     *plans.Resource
	Diags hcl.Diagnostics
}

// Bad records an error at rng.
func (b *Binder) Bad(rng hcl.Range, summary, detail string) {
	b.Diags = append(b.Diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr()})
}

// BadValue records an error in a value as written (plans.OwnValue: the value itself is
// wrong, whichever variable it came from).
func (b *Binder) BadValue(rng hcl.Range, summary, detail string) {
	b.Bad(rng, summary, detail)
	b.Diags[len(b.Diags)-1].Extra = plans.OwnValue
}

// Duration reads the positive duration at path (def when it is not set).
func (b *Binder) Duration(p *string, def time.Duration, path ...string) time.Duration {
	if p == nil {
		return def
	}
	d, err := time.ParseDuration(*p)
	if err != nil || d <= 0 {
		b.BadValue(b.R.Range(path...), "Invalid duration", fmt.Sprintf("%s = %q is not a positive duration such as \"90s\" or \"20m\".", strings.Join(path, "."), *p))
		return def
	}
	return d
}
