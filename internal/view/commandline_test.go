package view

import (
	"slices"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
)

func TestCommandLineLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		argv agent.CommandLine
		want []string
	}{
		{agent.CommandLine{"python3", "-m", "sglang.launch_server", "--port", "30000", "--enable-metrics"},
			[]string{"python3 -m sglang.launch_server", "--port 30000", "--enable-metrics"}},
		{agent.CommandLine{"/usr/bin/llama-server", "-m", "/m.gguf", "-c", "4096"},
			[]string{"/usr/bin/llama-server", "-m /m.gguf", "-c 4096"}},
		{agent.CommandLine{"fake", "--offset", "-1", "--tp-size=2"},
			[]string{"fake", "--offset -1", "--tp-size=2"}},
		{agent.CommandLine{"sglang", "serve", "/models/q", "--json-model-override-args", `{"a": 1}`},
			[]string{"sglang serve /models/q", `--json-model-override-args '{"a": 1}'`}},
	} {
		if got := commandLines(tc.argv); !slices.Equal(got, tc.want) {
			t.Errorf("%v:\n got %q\nwant %q", []string(tc.argv), got, tc.want)
		}
	}
}

func TestCommandLineDiff(t *testing.T) {
	t.Parallel()
	old := agent.CommandLine{"python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.85", "--tp-size=2", "--log-level", "info"}
	new := agent.CommandLine{"python3", "-m", "sglang.launch_server", "--mem-fraction-static", "0.8", "--tp-size=4", "--enable-metrics"}
	got := strings.Join(commandLineDiff(old, new), "\n")
	want := "~ --mem-fraction-static 0.85 → 0.8\n~ --tp-size 2 → 4\n+ --enable-metrics\n- --log-level info"
	if got != want {
		t.Errorf("diff:\n%s\nwant:\n%s", got, want)
	}
	if d := commandLineDiff(old, old); len(d) != 0 {
		t.Errorf("a command line differs from itself: %q", d)
	}
}
