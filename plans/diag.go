package plans

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// WriteDiagnostics prints diagnostics for a person: severity and summary, then
// file:line:column, the source line with the offending range underlined, and the detail.
// files maps file names to their sources (Plan.Files); a diagnostic without a range, or in
// a file not given, prints without the snippet.
func WriteDiagnostics(w io.Writer, files map[string]*hcl.File, diags hcl.Diagnostics) {
	for i, d := range diags {
		if i > 0 {
			fmt.Fprintln(w)
		}
		sev := "Error"
		if d.Severity == hcl.DiagWarning {
			sev = "Warning"
		}
		fmt.Fprintf(w, "%s: %s\n", sev, d.Summary)
		if d.Subject != nil {
			r := *d.Subject
			fmt.Fprintf(w, "  --> %s:%d:%d\n", r.Filename, r.Start.Line, r.Start.Column)
			if f, ok := files[r.Filename]; ok && f != nil {
				writeSnippet(w, f.Bytes, r)
			}
		}
		if d.Detail != "" {
			fmt.Fprintf(w, "%s\n", d.Detail)
		}
	}
	if n := len(diags); n > 1 {
		errs := 0
		for _, d := range diags {
			if d.Severity == hcl.DiagError {
				errs++
			}
		}
		fmt.Fprintf(w, "\n%d errors, %d warnings.\n", errs, n-errs)
	}
}

func writeSnippet(w io.Writer, src []byte, r hcl.Range) {
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 64*1024), MaxFileSize)
	for line := 1; sc.Scan(); line++ {
		if line < r.Start.Line {
			continue
		}
		if line > r.Start.Line {
			break
		}
		text := strings.ReplaceAll(sc.Text(), "\t", " ")
		gutter := fmt.Sprintf("%d", line)
		pad := strings.Repeat(" ", len(gutter))
		fmt.Fprintf(w, "  %s |\n  %s | %s\n", pad, gutter, text)
		start := r.Start.Column - 1
		end := len(text)
		if r.End.Line == r.Start.Line {
			end = r.End.Column - 1
		}
		start = min(max(start, 0), len(text))
		end = min(max(end, start+1), len(text)+1)
		// Columns are bytes in HCL's ranges; for the underline, count runes before start.
		lead := len([]rune(text[:start]))
		width := max(1, len([]rune(text[start:min(end, len(text))])))
		fmt.Fprintf(w, "  %s | %s%s\n", pad, strings.Repeat(" ", lead), strings.Repeat("^", width))
	}
}

// JSONDiagnostic is a diagnostic in --json output (part of the versioned output schema).
type JSONDiagnostic struct {
	Severity string     `json:"severity"`
	Summary  string     `json:"summary"`
	Detail   string     `json:"detail"`
	Range    *JSONRange `json:"range,omitempty"`
}

// JSONRange is a source range: file name and 1-based line and column of start and end.
type JSONRange struct {
	Filename string  `json:"filename"`
	Start    JSONPos `json:"start"`
	End      JSONPos `json:"end"`
}

// JSONPos is a position in a file.
type JSONPos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
}

// DiagnosticsJSON converts diagnostics to their JSON form.
func DiagnosticsJSON(diags hcl.Diagnostics) []JSONDiagnostic {
	out := make([]JSONDiagnostic, 0, len(diags))
	for _, d := range diags {
		j := JSONDiagnostic{Severity: "error", Summary: d.Summary, Detail: d.Detail}
		if d.Severity == hcl.DiagWarning {
			j.Severity = "warning"
		}
		if d.Subject != nil {
			r := d.Subject
			j.Range = &JSONRange{Filename: r.Filename,
				Start: JSONPos{r.Start.Line, r.Start.Column}, End: JSONPos{r.End.Line, r.End.Column}}
		}
		out = append(out, j)
	}
	return out
}

// DiagnosticsLine is diagnostics on one line, for a log or an error: each error as
// "file:line,col: summary; detail" ("summary; detail" when it has no place: hcl's own
// Error() prints a nil place as "<nil>:"), joined with "; and ".
func DiagnosticsLine(diags hcl.Diagnostics) string {
	var parts []string
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		s := d.Summary
		if d.Detail != "" {
			s += "; " + d.Detail
		}
		if d.Subject != nil {
			s = d.Subject.String() + ": " + s
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; and ")
}
