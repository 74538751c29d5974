package testbin

import (
	"os"
	"testing"
)

// Long marks a test too long for `go test -short` (it builds the agent, runs a chaos or
// fleet scenario): skipped under -short on a developer's machine, but never under
// CI=true, where a skipped test would hide a failure; there -short is ignored and the
// test runs.
func Long(t testing.TB, why string) {
	t.Helper()
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip(why + ": not in -short")
	}
}
