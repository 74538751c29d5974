package agent

import (
	"os/exec"
	"strings"
	"testing"
)

// ShellQuote's output must read back, through a real shell, as the word it quoted. A word
// with a control character (issue 27: a newline in a flag value forged a line of the
// plan) is in ANSI-C quotes, on one line: bash reads them (POSIX.1-2024 has them; dash
// does not yet, so bash is the shell here).
func TestShellQuoteRoundTrips(t *testing.T) {
	t.Parallel()
	for _, w := range []string{"", "plain", "/srv/models/Qwen 3", "it's", `a"b`, "$HOME", "x;rm -rf /", "tab\there", "--flag=v", "ünï", "*.json",
		"a\nb", "line\n  + --forged 1", "esc\x1b[2J", "it's\n\\", "cr\r", "nel\u0085x"} {
		q := ShellQuote(w)
		if strings.ContainsAny(q, "\n\r\x1b") {
			t.Errorf("ShellQuote(%q) = %q holds a control character", w, q)
		}
		out, err := exec.Command("bash", "-c", "printf %s "+q).Output()
		if err != nil {
			t.Fatalf("%q: %v", w, err)
		}
		if string(out) != w {
			t.Errorf("ShellQuote(%q) = %s reads back as %q", w, ShellQuote(w), out)
		}
	}
	if got := ShellQuote("--tp-size"); got != "--tp-size" {
		t.Errorf("a word that needs no quotes was quoted: %s", got)
	}
}
