package bytesize

import "testing"

func TestFormat(t *testing.T) {
	t.Parallel()
	for in, want := range map[int64]string{
		0:                 "0 B",
		1023:              "1023 B",
		1024:              "1.0 KiB",
		300 << 20:         "300.0 MiB",
		70<<30 + 1<<29:    "70.5 GiB",
		52 << 30:          "52.0 GiB",
		-2048:             "-2.0 KiB",
		1<<62 + 1<<61 + 0: "6.0 EiB",
	} {
		if got := Format(in); got != want {
			t.Errorf("Format(%d) = %q, want %q", in, got, want)
		}
	}
	if got := Format(uint64(141 << 30)); got != "141.0 GiB" {
		t.Errorf("Format(uint64) = %q", got)
	}
}

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"16GiB": 16 << 30, "512 MiB": 512 << 20, "2GB": 2e9, "4096": 4096, "1.5 GiB": 3 << 29, "0": 0} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1GiB", "8 parsecs", "1e30GiB"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) succeeded", in)
		}
	}
}
