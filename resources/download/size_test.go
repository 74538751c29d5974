package download

import (
	"encoding/json"
	"testing"
)

// Issue 29 point 6: a download's file change carries bytes in --json (docs/json-output.md:
// sizes are bytes), and the sentence people read in agent plan.
func TestDownloadChangeIsBytesForMachines(t *testing.T) {
	for _, c := range []struct {
		d          downloadSize
		json, text string
	}{
		{toDownload(16<<20, 0), "16777216", "download 16.0 MiB"},
		{toDownload(16<<20, 4<<20), "16777216", "download 16.0 MiB (resume, 4.0 MiB on disk)"},
		{toDownload(-1, 0), "-1", "download size unknown"},
	} {
		b, err := json.Marshal(c.d)
		if err != nil || string(b) != c.json || c.d.String() != c.text {
			t.Errorf("%+v: json %s (%v), text %q; want %s and %q", c.d, b, err, c.d.String(), c.json, c.text)
		}
	}
}
