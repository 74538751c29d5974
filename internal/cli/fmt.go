package cli

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/agent-dev/agent/internal/atomicfile"
	"github.com/agent-dev/agent/internal/textdiff"
	"github.com/agent-dev/agent/plans"
)

// runFmt rewrites plan files in canonical form; with -check it only reports the files
// that would change (exit 3), for CI.
func runFmt(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent fmt", flag.ContinueOnError)
	fs.SetOutput(stderr)
	check := fs.Bool("check", false, "report files that are not formatted (exit 3) instead of rewriting them")
	showDiff := fs.Bool("diff", false, "print the changes")
	pos, code, ok := parseArgs("fmt", fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) == 0 {
		pos = []string{"."}
	}
	var files []string
	for _, p := range pos {
		st, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(stderr, "agent fmt: %v\n", err)
			return ExitError
		}
		if st.IsDir() {
			m, _ := filepath.Glob(filepath.Join(p, "*.hcl"))
			sort.Strings(m)
			files = append(files, m...)
		} else {
			files = append(files, p)
		}
	}
	code = ExitOK
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(stderr, "agent fmt: %v\n", err)
			return ExitError
		}
		out, diags := plans.Format(f, src)
		if diags.HasErrors() {
			plans.WriteDiagnostics(stderr, nil, diags)
			return ExitError
		}
		if bytes.Equal(src, out) {
			continue
		}
		fmt.Fprintln(stdout, f)
		if *showDiff {
			fmt.Fprint(stdout, textdiff.Unified(f, src, out))
		}
		if *check {
			code = ExitDegraded
			continue
		}
		st, _ := os.Stat(f)
		if err := atomicfile.WriteFile(f, out, st.Mode().Perm()); err != nil {
			fmt.Fprintf(stderr, "agent fmt: %v\n", err)
			return ExitError
		}
	}
	return code
}
