package download

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/resources/restest"
)

// A download with ensure = "absent" removes exactly the files its manifest lists: a
// file the operator put in dest stays, and so does dest with it.
func TestDownloadEnsureAbsentRemovesOnlyManifestFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dest := filepath.Join(dir, "m")
	ctx := context.Background()
	// The manifest is fetch's: place two verified files with it, from a loopback server.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, r.URL.Path, time.Time{}, strings.NewReader("data of "+r.URL.Path))
	}))
	defer srv.Close()
	var files []fetch.File
	for _, n := range []string{"a.bin", "sub/b.bin"} {
		body := "data of /" + n
		sum := sha256.Sum256([]byte(body))
		files = append(files, fetch.File{Name: n, URL: srv.URL + "/" + n, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	}
	if _, err := fetch.Fetch(ctx, files, fetch.Options{Dest: dest}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dest, ".agent-fetch.lock")); err != nil {
		t.Fatalf("fetch left no lock file to prove its removal: %v", err)
	}
	// A partial fetch left (its sidecar), in a directory of its own: fetch's, removed too.
	os.MkdirAll(filepath.Join(dest, "part"), 0o755)
	for _, n := range []string{"part/.c.bin.partial", "part/.c.bin.partial.json"} {
		if err := os.WriteFile(filepath.Join(dest, n), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dest, "mine.txt"), []byte("the operator's"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := restest.OpenStore(t, filepath.Join(dir, "state"))
	src := fmt.Sprintf("download \"m\" {\n  ensure = \"absent\"\n  dest = %q\n  file \"a.bin\" {\n    url    = \"http://127.0.0.1:1/a\"\n    sha256 = \"%s\"\n  }\n}\n", dest, files[0].SHA256)
	e := restest.Engine(t, dir, src, kinds(), store, agent.Options{})
	st := e.Plan(ctx).Steps[0]
	if st.Err != nil || st.Diff.Action != agent.Delete || len(st.Diff.Changes) != 2 {
		t.Fatalf("plan: %v %+v", st.Err, st.Diff)
	}
	if w := strings.Join(st.Diff.Warnings, "\n"); !strings.Contains(w, dest+" is kept: it holds 1 files the agent did not place (mine.txt)") {
		t.Errorf("plan warnings %q: the operator's file is not said", w)
	}
	if st = e.Apply(ctx, nil).Steps[0]; st.Err != nil || !st.Applied {
		t.Fatalf("apply: %v", st.Err)
	}
	for _, n := range []string{"a.bin", "sub/b.bin", "sub", fetch.ManifestName, ".agent-fetch.lock", "part"} {
		if _, err := os.Lstat(filepath.Join(dest, n)); !os.IsNotExist(err) {
			t.Errorf("%s after the delete: %v", n, err)
		}
	}
	if data, err := os.ReadFile(filepath.Join(dest, "mine.txt")); err != nil || string(data) != "the operator's" {
		t.Errorf("the operator's file: %q %v", data, err)
	}
	// Without the operator's file, nothing is left: dest itself goes.
	os.Remove(filepath.Join(dest, "mine.txt"))
	if _, err := fetch.Fetch(ctx, files, fetch.Options{Dest: dest}); err != nil {
		t.Fatal(err)
	}
	if st = e.Apply(ctx, nil).Steps[0]; st.Err != nil || !st.Applied || len(st.Diff.Warnings) != 0 {
		t.Fatalf("second apply: %v %v", st.Err, st.Diff.Warnings)
	}
	if _, err := os.Lstat(dest); !os.IsNotExist(err) {
		t.Errorf("dest after a delete that left nothing of the operator's: %v", err)
	}
}
