package agent

import "strings"

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

// ShellQuote returns w as a POSIX shell reads it back: bare when it holds only characters
// that need no quoting, else in single quotes.
func ShellQuote(w string) string {
	if w == "" {
		return "''"
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
