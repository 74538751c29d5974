// Package cmdline is the one rule by which a server's flags map becomes its command line:
// "--name value" for a string or a number, a bare "--name" for true, nothing for false,
// the flags sorted by name after the command. The server resource launches by it and
// agent export reads a running command line back through it, so the two can never
// disagree about which argv a plan means (a disagreement would be a needless relaunch
// after every export).
package cmdline

import (
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// Flag returns the arguments of one flag. name may carry a leading "--". value is a
// string, a bool, or a number (*big.Float, float64 or int), written as Number writes it.
func Flag(name string, value any) ([]string, error) {
	name = "--" + strings.TrimPrefix(name, "--")
	switch v := value.(type) {
	case string:
		return []string{name, v}, nil
	case bool:
		if v {
			return []string{name}, nil
		}
		return nil, nil
	case *big.Float:
		return []string{name, Number(v)}, nil
	case float64:
		return []string{name, Number(big.NewFloat(v))}, nil
	case int:
		return []string{name, strconv.Itoa(v)}, nil
	default:
		return nil, fmt.Errorf("%s is a %T; a flag is a string, a number or a boolean", name, value)
	}
}

// Render returns command followed by flags, sorted by name (without a leading "--"),
// each as Flag writes it.
func Render(command []string, flags map[string]any) ([]string, error) {
	out := slices.Clone(command)
	names := slices.SortedFunc(maps.Keys(flags), func(a, b string) int {
		return strings.Compare(strings.TrimPrefix(a, "--"), strings.TrimPrefix(b, "--"))
	})
	for _, name := range names {
		args, err := Flag(name, flags[name])
		if err != nil {
			return nil, err
		}
		out = append(out, args...)
	}
	return out, nil
}

// Number writes a number as it goes on a command line: an integer without a point or
// an exponent ("2", "30000"), anything else as the shortest decimal that reads back
// to the same float64 ("0.85", not "8.5e-01").
//
// An integer is written in full only below 1e21, where the plan's number is exact: past
// it, the digits of a binary approximation are not what the plan said (1e300 would be
// written as 301 digits ending in noise), so it is written as the shortest float that
// reads back to the same value ("1e+300"), which is what a Python float flag parses.
func Number(f *big.Float) string {
	if f.IsInt() && new(big.Float).Abs(f).Cmp(big.NewFloat(1e21)) < 0 {
		i, _ := f.Int(nil)
		return i.String()
	}
	x, _ := f.Float64()
	if f.IsInt() {
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	return strconv.FormatFloat(x, 'f', -1, 64)
}
