package server

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/internal/cmdline"
	"github.com/zclconf/go-cty/cty"
)

// flagEdge is what renderFlags refuses at a flag's edges, or "": an empty name (it would
// render a bare "--", which ends the server's options), a number the server cannot read
// (beyond float64: argparse would read inf), a port that is not a port number.
func flagEdge(key string, val cty.Value) string {
	name := strings.TrimPrefix(key, "--")
	if strings.TrimSpace(name) == "" {
		return fmt.Sprintf("flags has an empty flag name (%q); a flag is named without its dashes, e.g. \"tp-size\".", key)
	}
	if val.IsNull() || !val.IsKnown() {
		return ""
	}
	if val.Type() == cty.Number {
		if x, _ := val.AsBigFloat().Float64(); val.AsBigFloat().IsInf() || math.IsInf(x, 0) {
			return fmt.Sprintf("flags[%q] is beyond what the server can read as a number.", key)
		}
	}
	if name == "port" {
		switch val.Type() {
		case cty.String:
			n, err := strconv.Atoi(strings.TrimSpace(val.AsString()))
			if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != val.AsString() {
				return fmt.Sprintf("flags[%q] = %q is not a TCP port (1-65535); write it as a number: %s = 30000.", key, val.AsString(), key)
			}
		case cty.Number:
			bf := val.AsBigFloat()
			if n, acc := bf.Int64(); !bf.IsInt() || acc != big.Exact || n < 1 || n > 65535 {
				return fmt.Sprintf("flags[%q] = %s is not a TCP port (1-65535).", key, cmdline.Number(bf))
			}
		case cty.Bool:
			return fmt.Sprintf("flags[%q] is a bool; it is the server's TCP port, a number such as 30000.", key)
		}
	}
	return ""
}
