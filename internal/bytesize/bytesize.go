// Package bytesize renders byte counts for people, in binary units ("52.0 GiB"): one
// format for download progress, free-space errors, GPU memory and status lines; and
// reads the sizes a plan writes ("8GiB").
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Format renders n bytes: "512 B", "64.0 KiB", "52.0 GiB".
func Format[T ~int64 | ~uint64 | ~int](n T) string {
	const unit = 1024
	v := uint64(n)
	if n < 0 {
		return "-" + Format(-int64(n))
	}
	if v < unit {
		return fmt.Sprintf("%d B", v)
	}
	div, exp := uint64(unit), 0
	for m := v / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(v)/float64(div), "KMGTPE"[exp])
}

// Parse reads a size as a plan writes it: a number of bytes with a unit, "16GiB",
// "512 MiB", "2GB" (powers of 1000), "4096" (bytes).
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.TrimSpace(t[i:])
	}
	mult, ok := units[strings.ToLower(unit)]
	v, err := strconv.ParseFloat(num, 64)
	if !ok || err != nil || num == "" || v < 0 || v*float64(mult) > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is not a size: write a number with a unit, such as \"8GiB\", \"512MiB\" or \"2GB\"", s)
	}
	return int64(v * float64(mult)), nil
}

var units = map[string]int64{
	"": 1, "b": 1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}
