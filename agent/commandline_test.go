package agent

import (
	"os/exec"
	"slices"
	"strings"
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

func TestCommandLineLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		argv CommandLine
		want []string
	}{
		{CommandLine{"python3", "-m", "sglang.launch_server", "--port", "30000", "--enable-metrics"},
			[]string{"python3 -m sglang.launch_server", "--port 30000", "--enable-metrics"}},
		{CommandLine{"/usr/bin/llama-server", "-m", "/m.gguf", "-c", "4096"},
			[]string{"/usr/bin/llama-server", "-m /m.gguf", "-c 4096"}},
		{CommandLine{"fake", "--offset", "-1", "--tp-size=2"},
			[]string{"fake", "--offset -1", "--tp-size=2"}},
		{CommandLine{"sglang", "serve", "/models/q", "--json-model-override-args", `{"a": 1}`},
			[]string{"sglang serve /models/q", `--json-model-override-args '{"a": 1}'`}},
	} {
		if got := tc.argv.lines(); !slices.Equal(got, tc.want) {
			t.Errorf("%v:\n got %q\nwant %q", []string(tc.argv), got, tc.want)
		}
	}
}

func TestCommandLineDiff(t *testing.T) {
	t.Parallel()
	old := CommandLine{"python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.85", "--tp-size=2", "--log-level", "info"}
	new := CommandLine{"python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.8", "--tp-size=4", "--enable-metrics"}
	got := strings.Join(commandLineDiff(old, new), "\n")
	want := "~ --mem-fraction-static 0.85 → 0.8\n~ --tp-size 2 → 4\n+ --enable-metrics\n- --log-level info"
	if got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
	if d := commandLineDiff(old, old); len(d) != 0 {
		t.Errorf("a command line differs from itself: %q", d)
	}
}
