package download

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
	"github.com/agent-dev/agent/resources/restest"
)

// And for a download's destination: a dest under a directory nobody owns is refused,
// and nothing is fetched into it.
func TestDownloadRefusesADestAnotherUserControls(t *testing.T) {
	t.Parallel()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	data := randBytes(4<<10, 7)
	s.Set("/a.bin", data)
	root := filepath.Join(t.TempDir(), "models")
	os.Mkdir(root, 0o755)
	os.Chown(root, 65534, 65534)
	store := restest.OpenStore(t, filepath.Join(t.TempDir(), "state"))
	e := restest.Engine(t, t.TempDir(), explicitPlan(s, map[string][]byte{"a.bin": data}, ""), kinds(), store, agent.Options{}, "root="+root)
	for _, st := range []*agent.Step{e.Plan(t.Context()).Steps[0], e.Apply(t.Context(), nil).Steps[0]} {
		if st.Err == nil || !strings.Contains(st.Err.Error(), "chown root:root "+root) {
			t.Errorf("err = %v, want a refusal naming %s with the fix", st.Err, root)
		}
	}
	if s.Stats("/a.bin").BytesSent != 0 {
		t.Error("bytes were fetched into an untrusted destination")
	}
}

// Point 9: ".." in dest is refused, not silently cleaned.
func TestDotDotRefusedInDest(t *testing.T) {
	t.Parallel()
	_, diags := restest.BindPlan(`download "x" {
  dest = "/srv/models/../../etc"
  huggingface { repo = "a/b" }
}
`, kinds())
	var msg string
	for _, d := range diags {
		msg += d.Summary + ": " + d.Detail + "\n"
	}
	for _, want := range []string{`Destination with ..`, `"/srv/models/../../etc" has a ".." element`, "(/etc)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, msg)
		}
	}
}
