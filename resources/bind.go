package resources

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/plans"
)

// binder collects the diagnostics of one block's bind: what types cannot say (an
// absolute path, a positive duration, one of two values), each pointing into the plan.
// A kind's bind function fills its resource through it and returns its diagnostics.
type binder struct {
	r     *plans.Resource
	diags hcl.Diagnostics
}

// bad records an error at rng.
func (b *binder) bad(rng hcl.Range, summary, detail string) {
	b.diags = append(b.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr()})
}

// badValue records an error in a value as written (plans.OwnValue: the value itself is
// wrong, whichever variable it came from).
func (b *binder) badValue(rng hcl.Range, summary, detail string) {
	b.bad(rng, summary, detail)
	b.diags[len(b.diags)-1].Extra = plans.OwnValue
}

// duration reads the positive duration at path (def when it is not set).
func (b *binder) duration(p *string, def time.Duration, path ...string) time.Duration {
	if p == nil {
		return def
	}
	d, err := time.ParseDuration(*p)
	if err != nil || d <= 0 {
		b.badValue(b.r.Range(path...), "Invalid duration", fmt.Sprintf("%s = %q is not a positive duration such as \"90s\" or \"20m\".", strings.Join(path, "."), *p))
		return def
	}
	return d
}
