package agent

import (
	"os/exec"
	"testing"
)

// ShellQuote's output must read back, through a real shell, as the word it quoted.
func TestShellQuoteRoundTrips(t *testing.T) {
	t.Parallel()
	for _, w := range []string{"", "plain", "/srv/models/Qwen 3", "it's", `a"b`, "$HOME", "x;rm -rf /", "tab\there", "--flag=v", "ünï", "*.json"} {
		out, err := exec.Command("sh", "-c", "printf %s "+ShellQuote(w)).Output()
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
