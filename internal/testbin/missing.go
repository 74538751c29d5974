package testbin

import (
	"os"
	"testing"
)

// Missing stops a test whose prerequisite (a binary, root, a static busybox) this machine
// lacks: skipped on a developer's machine, but a failure under CI=true, where a skipped
// test would hide one (CI installs everything the tests need, and runs as root). what
// says what is missing; fix how to get it.
func Missing(tb testing.TB, what, fix string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s; CI=true, so this is a failure, not a skip. %s", what, fix)
		return // a recording TB (tests of a caller) does not stop here
	}
	tb.Skipf("%s; %s", what, fix)
}
