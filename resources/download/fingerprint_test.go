package download

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources/restest"
)

// A saved plan of a download from a Hub branch is bound to the commit the branch resolved
// to and to the manifest it wanted: once the branch moves, the saved plan is refused,
// naming both commits, and nothing is fetched.
func TestDownloadSavedPlanRefusedWhenTheBranchMoved(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newFakeHub(t, hubFiles())
	tokenFile := filepath.Join(dir, "hf-token")
	os.WriteFile(tokenFile, []byte(h.token+"\n"), 0o600)
	src := hubPlan(h, tokenFile, "main")
	mustApply(t, engine(t, dir, src))

	saved := func() *agent.Engine {
		return restest.Engine(t, dir, src, kinds(), restest.OpenStore(t, filepath.Join(dir, ".state")),
			agent.Options{FingerprintKey: []byte("key")}, "root="+dir)
	}
	st := planStep(t, saved(), "download.model")
	fp := st.Fingerprint
	if fp == nil || fp.Facts["commit"] != h.commit || !strings.HasPrefix(fp.Facts["manifest"], "sha256:") {
		t.Fatalf("fingerprint %+v: want the commit %s and the manifest's hash", fp, h.commit)
	}

	old := h.commit
	h.mu.Lock()
	h.commit = strings.Repeat("cd", 20)
	h.files[1].data = randBytes(200<<10, 99)
	h.mu.Unlock()
	h.cdn.Set("/cdn/"+sha(h.files[1].data), h.files[1].data)
	cdnBefore, _ := h.cdnBytes()

	_, err := saved().ApplySaved(t.Context(), map[string]agent.Fingerprint{"download.model": *fp}, nil, nil)
	var stale *agent.StaleError
	if !errors.As(err, &stale) {
		t.Fatalf("apply of the saved plan after the branch moved: %v, want a refusal", err)
	}
	got := strings.Join(stale.Changed["download.model"], "; ")
	for _, want := range []string{"planned no-op, now update", "commit: " + old + " → " + h.commit, "manifest: sha256:"} {
		if !strings.Contains(got, want) {
			t.Errorf("refusal %q does not say %q", got, want)
		}
	}
	if n, _ := h.cdnBytes(); n != cdnBefore {
		t.Errorf("the refused apply fetched %d bytes", n-cdnBefore)
	}
}
