// Package bytesize renders byte counts for people, in binary units ("52.0 GiB"): one
// format for download progress, free-space errors, GPU memory and status lines.
package bytesize

import "fmt"

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
