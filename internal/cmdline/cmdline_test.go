package cmdline

import (
	"math/big"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRender(t *testing.T) {
	t.Parallel()
	got, err := Render([]string{"python3", "-m", "sglang.launch_server"}, map[string]any{
		"tp-size":               2,
		"mem-fraction-static":   0.85,
		"port":                  big.NewFloat(30000),
		"model-path":            "/models/Qwen3.6-27B",
		"enable-metrics":        true,
		"disable-cuda-graph":    false,
		"--served-model-name":   "a b; rm -rf /", // one argument, never split
		"speculative-eagle-top": big.NewFloat(1e-7),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"python3", "-m", "sglang.launch_server",
		"--enable-metrics",
		"--mem-fraction-static", "0.85",
		"--model-path", "/models/Qwen3.6-27B",
		"--port", "30000",
		"--served-model-name", "a b; rm -rf /",
		"--speculative-eagle-top", "0.0000001",
		"--tp-size", "2",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Render (-want +got):\n%s", diff)
	}
}

func TestNumber(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"2": "2", "30000": "30000", "-1": "-1", "0.85": "0.85", "0.8": "0.8", "1e3": "1000",
		"12345678901234567890": "12345678901234567890", "1.5e-3": "0.0015",
		// Past 1e21 the plan's integer is no longer exact: the shortest float (issue 13, 9).
		"1e300": "1e+300", "-1e30": "-1e+30", "999999999999999999999": "999999999999999999999",
	} {
		f, _, err := big.ParseFloat(in, 10, 512, big.ToNearestEven)
		if err != nil {
			t.Fatal(err)
		}
		if got := Number(f); got != want {
			t.Errorf("Number(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestFlagRefusesOtherTypes(t *testing.T) {
	t.Parallel()
	if _, err := Flag("bad", []int{1}); err == nil || !strings.Contains(err.Error(), "--bad is a []int") {
		t.Errorf("Flag of a list: %v", err)
	}
}
