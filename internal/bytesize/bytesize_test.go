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
