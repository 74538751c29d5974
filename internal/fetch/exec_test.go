package fetch_test

import (
	"os"
	osexec "os/exec"
	"strings"
	"testing"
)

// exec prepares the test binary to run with extra NAME=VALUE environment entries.
func exec(t *testing.T, exe string, args ...string) *osexec.Cmd {
	t.Helper()
	var flags, env []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			flags = append(flags, a)
		} else {
			env = append(env, a)
		}
	}
	cmd := osexec.Command(exe, flags...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	return cmd
}
