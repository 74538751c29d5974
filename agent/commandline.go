package agent

import (
	"fmt"
	"strings"
)

// CommandLine is an argv as a diff value. --json emits it as the list of strings it is;
// the human view (internal/view) writes it as a person would type it: the program on the
// first line, then one flag with its values per line, shell-quoted only where needed. A
// change from one command line to another shows only the flags that differ
// (`~ --mem-fraction-static 0.85 → 0.8`), not two long escaped lists to compare by eye.
type CommandLine []string

// String is the command line on one line, shell-quoted where needed.
func (c CommandLine) String() string {
	q := make([]string, len(c))
	for i, w := range c {
		q[i] = ShellQuote(w)
	}
	return strings.Join(q, " ")
}

// isControl reports a control character: C0, DEL or C1 (a terminal acts on them).
func isControl(r rune) bool { return r < 0x20 || r >= 0x7f && r < 0xa0 }

// ShellQuote returns w as a POSIX shell reads it back: bare when it holds only characters
// that need no quoting, else in single quotes; a word with a control character (a
// newline in a flag value) in ANSI-C quotes ($'a\nb', POSIX.1-2024), so that it stays
// on its line and cannot forge another line of a plan or a log.
func ShellQuote(w string) string {
	if w == "" {
		return "''"
	}
	if strings.IndexFunc(w, isControl) >= 0 {
		var b strings.Builder
		b.WriteString("$'")
		for _, r := range w {
			switch {
			case r == '\\' || r == '\'':
				b.WriteByte('\\')
				b.WriteRune(r)
			case r == '\n':
				b.WriteString(`\n`)
			case r == '\t':
				b.WriteString(`\t`)
			case r == '\r':
				b.WriteString(`\r`)
			case r < 0x80 && isControl(r):
				fmt.Fprintf(&b, `\x%02x`, r)
			case isControl(r):
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				b.WriteRune(r)
			}
		}
		b.WriteByte('\'')
		return b.String()
	}
	safe := true
	for _, r := range w {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%^", r)) {
			safe = false
			break
		}
	}
	if safe {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}
