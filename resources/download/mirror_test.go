package download

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources/restest"
)

// TestDownloadHubFromMirror: a second host whose plan names the first host's download as a
// mirror (a plain http.FileServer over its verified dest, as docs/fleet.md serves one)
// takes the manifest from the Hub (the revision and the listing) and every byte from the
// mirror: the Hub's resolve URLs and the CDN are never asked, and the Hub token never
// reaches the mirror. A third host, whose mirror has one file corrupted (same size), still
// lands every file verified: that file alone comes from the Hub.
func TestDownloadHubFromMirror(t *testing.T) {
	t.Parallel()
	h := newFakeHub(t, hubFiles())
	seeder := t.TempDir()
	tokenFile := filepath.Join(seeder, "hf-token")
	os.WriteFile(tokenFile, []byte(h.token+"\n"), 0o600)
	mustApply(t, engine(t, seeder, hubPlan(h, tokenFile, "main")))
	seederDest := filepath.Join(seeder, "models", "m")

	var mirrorAuth atomic.Int64
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			mirrorAuth.Add(1)
		}
		http.StripPrefix("/m", http.FileServer(http.Dir(seederDest))).ServeHTTP(w, r)
	}))
	t.Cleanup(mirror.Close)
	withMirror := func() string {
		return strings.Replace(hubPlan(h, tokenFile, "main"), "concurrency = 2", "concurrency = 2\n  mirrors = [\""+mirror.URL+"/m/\"]", 1)
	}
	// resolves counts the Hub's resolve requests (file bytes) since the last call.
	seen := 0
	resolves := func() (n int) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, p := range h.paths[seen:] {
			if strings.Contains(p, "/resolve/") {
				n++
			}
		}
		seen = len(h.paths)
		return n
	}
	resolves()
	cdnBefore, _ := h.cdnBytes()

	host2 := t.TempDir()
	e := engine(t, host2, withMirror())
	if st := planStep(t, e, "download.model"); st.Diff.Action != agent.Create {
		t.Fatalf("plan: %s", st.Diff.Action)
	}
	mustApply(t, e)
	for _, f := range h.files {
		if f.path != "README.md" && !strings.HasPrefix(f.path, "original/") {
			wantContent(t, filepath.Join(host2, "models", "m", f.path), f.data)
		}
	}
	if n := resolves(); n != 0 {
		t.Errorf("the Hub's resolve URLs were asked %d times: bytes came from the origin", n)
	}
	if cdn, _ := h.cdnBytes(); cdn != cdnBefore {
		t.Errorf("the CDN sent %d bytes though the mirror holds every file", cdn-cdnBefore)
	}
	if n := mirrorAuth.Load(); n != 0 {
		t.Errorf("the mirror saw an Authorization header %d times: the Hub token leaked", n)
	}
	man, _ := os.ReadFile(filepath.Join(host2, "models", "m", ".agent-manifest.json"))
	if !strings.Contains(string(man), h.commit) {
		t.Error("the manifest does not record the Hub's commit")
	}

	// A corrupted copy on the mirror (same size): caught by the Hub's sha256, fetched from
	// the Hub alone.
	bad := filepath.Join(seederDest, "model-00002-of-00002.safetensors")
	data, _ := os.ReadFile(bad)
	data[100] ^= 0xff
	os.WriteFile(bad, data, 0o644)
	host3 := t.TempDir()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	mustApply(t, restest.Engine(t, host3, withMirror(), kinds(), restest.OpenStore(t, filepath.Join(host3, ".state")), agent.Options{Log: log}, "root="+host3))
	for _, want := range []string{`msg="mirror passed over" resource=download.model file=model-00002-of-00002.safetensors`, "checksum mismatch",
		"files_from_mirrors=3 files_from_origin=1 origin_bytes=204800"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log %q: want %q", logs.String(), want)
		}
	}
	for _, f := range h.files {
		if f.path != "README.md" && !strings.HasPrefix(f.path, "original/") {
			wantContent(t, filepath.Join(host3, "models", "m", f.path), f.data)
		}
	}
	if n := resolves(); n == 0 {
		t.Error("the corrupted file was not fetched from the Hub")
	}
	cdn, _ := h.cdnBytes()
	if want := int64(200 << 10); cdn-cdnBefore != want {
		t.Errorf("the CDN sent %d bytes, want %d: the corrupted file alone", cdn-cdnBefore, want)
	}
	if st := planStep(t, engine(t, host3, withMirror()), "download.model"); st.Diff.Action != agent.NoOp {
		t.Errorf("plan after apply: %s %+v", st.Diff.Action, st.Diff.Changes)
	}
}

func TestDownloadMirrorBindErrors(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"ftp://peer/qwen", "http://user:pw@peer/qwen", "http://peer/qwen?x=1", "peer:8088/qwen"} {
		_, diags := restest.BindPlan(`download "x" {
  dest    = "/m"
  mirrors = ["`+m+`"]
  huggingface { repo = "a/b" }
}
`, kinds())
		if !strings.Contains(diags.Error(), "Invalid mirror") || strings.Contains(diags.Error(), "pw") {
			t.Errorf("mirror %q: diagnostics %q, want Invalid mirror (without the password)", m, diags.Error())
		}
	}
	if _, diags := restest.BindPlan(`download "x" {
  dest    = "/m"
  mirrors = ["http://kpro5.lan:8088/qwen", "https://peer/qwen/"]
  huggingface { repo = "a/b" }
}
`, kinds()); diags.HasErrors() {
		t.Errorf("plain http mirrors on the LAN: %v", diags)
	}
}
