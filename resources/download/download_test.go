package download

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

func randBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	var s [32]byte
	s[0], s[1] = byte(seed), byte(seed>>8)
	rand.NewChaCha8(s).Read(b)
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// engine loads src (plan.hcl in dir, with var.root = dir) over the state in dir/.state. Each
// call is a fresh engine, as a new agent process would be.
func engine(t testing.TB, dir, src string) *agent.Engine {
	t.Helper()
	return restest.InDir(t, dir, src, kinds())
}

// kinds is what the download tests' plans declare.
func kinds() []agent.Kind { return []agent.Kind{DownloadKind(resources.Machine{})} }

func mustApply(t testing.TB, e *agent.Engine) *agent.Report {
	t.Helper()
	rep := e.Apply(t.Context(), nil)
	for _, st := range rep.Steps {
		if st.Err != nil {
			t.Fatalf("apply %s: %v", st.Addr, st.Err)
		}
	}
	return rep
}

func planStep(t testing.TB, e *agent.Engine, addr string) *agent.Step {
	t.Helper()
	for _, st := range e.Plan(t.Context()).Steps {
		if st.Addr == addr {
			if st.Err != nil {
				t.Fatalf("plan %s: %v", addr, st.Err)
			}
			return st
		}
	}
	t.Fatalf("no step %s", addr)
	return nil
}

func wantContent(t *testing.T, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes sha256 %s, want %d bytes sha256 %s", p, len(got), sha(got), len(want), sha(want))
	}
}

// fakeHub is a Hub API of our own: a tree listing in pages, the revision API, and resolve
// URLs that serve files kept in git directly and redirect LFS files to a CDN (a
// fetchtest.Server that refuses any Authorization header).
type fakeHub struct {
	srv      *httptest.Server
	cdn      *fetchtest.Server
	token    string
	repo     string
	commit   string
	pageSize int
	files    []hubTestFile
	requests atomic.Int64
	mu       sync.Mutex
	paths    []string // request paths seen
	noRevAPI bool     // a mirror without /api/models/{repo}/revision
}

type hubTestFile struct {
	path string
	data []byte
	lfs  bool
}

func newFakeHub(t testing.TB, files []hubTestFile) *fakeHub {
	h := &fakeHub{token: "hf_secret_token_123", repo: "org/model", commit: strings.Repeat("ab", 20), pageSize: 3, files: files}
	h.cdn = fetchtest.NewServer()
	t.Cleanup(h.cdn.Close)
	for _, f := range files {
		if f.lfs {
			h.cdn.Set("/cdn/"+sha(f.data), f.data)
			h.cdn.SetFault("/cdn/"+sha(f.data), fetchtest.Fault{DenyAuth: true})
		}
	}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func blobID(b []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(b))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

func (h *fakeHub) serve(w http.ResponseWriter, r *http.Request) {
	h.requests.Add(1)
	h.mu.Lock()
	h.paths = append(h.paths, r.Method+" "+r.URL.Path)
	h.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+h.token {
		http.Error(w, "token required", http.StatusUnauthorized)
		return
	}
	api := "/api/models/" + h.repo
	switch p := r.URL.Path; {
	case p == api+"/revision/main":
		if h.noRevAPI {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"id": h.repo, "sha": h.commit})
	case p == api+"/tree/"+h.commit || (h.noRevAPI && p == api+"/tree/main"):
		if r.URL.Query().Get("recursive") != "true" {
			http.Error(w, "want recursive", http.StatusBadRequest)
			return
		}
		var entries []map[string]any
		dirs := map[string]bool{}
		for _, f := range h.files {
			if d := filepath.Dir(f.path); d != "." && !dirs[d] {
				dirs[d] = true
				entries = append(entries, map[string]any{"type": "directory", "path": d, "oid": "0", "size": 0})
			}
			e := map[string]any{"type": "file", "path": f.path, "oid": blobID(f.data), "size": len(f.data)}
			if f.lfs {
				e["oid"] = blobID([]byte("pointer " + f.path))
				e["size"] = 134
				e["lfs"] = map[string]any{"oid": sha(f.data), "size": len(f.data), "pointerSize": 134}
			}
			entries = append(entries, e)
		}
		start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
		end := min(start+h.pageSize, len(entries))
		if end < len(entries) {
			w.Header().Set("Link", fmt.Sprintf(`<%s%s?recursive=true&cursor=%d>; rel="next"`, h.srv.URL, p, end))
		}
		json.NewEncoder(w).Encode(entries[start:end])
	case strings.HasPrefix(p, "/"+h.repo+"/resolve/"):
		rest := strings.TrimPrefix(p, "/"+h.repo+"/resolve/")
		rev, name, _ := strings.Cut(rest, "/")
		if rev != h.commit && rev != "main" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("X-Repo-Commit", h.commit)
		for _, f := range h.files {
			if f.path != name {
				continue
			}
			if f.lfs {
				w.Header().Set("X-Linked-Etag", `"`+sha(f.data)+`"`)
				w.Header().Set("X-Linked-Size", strconv.Itoa(len(f.data)))
				http.Redirect(w, r, h.cdn.URL("/cdn/"+sha(f.data)), http.StatusFound)
				return
			}
			w.Header().Set("ETag", `"`+blobID(f.data)+`"`)
			http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.data))
			return
		}
		http.NotFound(w, r)
	default:
		http.NotFound(w, r)
	}
}

func (h *fakeHub) cdnBytes() (n int64, auth int) {
	for _, f := range h.files {
		if f.lfs {
			st := h.cdn.Stats("/cdn/" + sha(f.data))
			n += st.BytesSent
			auth += st.AuthSeen
		}
	}
	return n, auth
}

func hubFiles() []hubTestFile {
	return []hubTestFile{
		{path: "model-00001-of-00002.safetensors", data: randBytes(300<<10, 1), lfs: true},
		{path: "model-00002-of-00002.safetensors", data: randBytes(200<<10, 2), lfs: true},
		{path: "config.json", data: []byte(`{"architectures":["Qwen3"]}` + "\n")},
		{path: "tokenizer/tokenizer.json", data: randBytes(10<<10, 3)},
		{path: "README.md", data: []byte("# model\n")},
		{path: "original/consolidated.safetensors", data: randBytes(100<<10, 4), lfs: true},
	}
}

func hubPlan(h *fakeHub, tokenFile, revision string) string {
	return fmt.Sprintf(`
variable "root" {}
download "model" {
  dest = "${var.root}/models/m"
  huggingface {
    repo       = %q
    revision   = %q
    include    = ["*.safetensors", "*.json"]
    exclude    = ["original/"]
    token_file = %q
    endpoint   = %q
  }
  concurrency = 2
}
`, h.repo, revision, tokenFile, h.srv.URL)
}

// TestDownloadHubEndToEnd covers the huggingface source: a paged tree listing, the revision
// resolved once and recorded, include/exclude, the token sent to the Hub and never to the
// CDN a redirect leads to (nor written to state), an apply that a fresh Check proves, and a
// plan of the converged download that makes no request at all once the revision is pinned.
func TestDownloadHubEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newFakeHub(t, hubFiles())
	tokenFile := filepath.Join(dir, "hf-token")
	os.WriteFile(tokenFile, []byte(h.token+"\n"), 0o600)
	dest := filepath.Join(dir, "models", "m")

	e := engine(t, dir, hubPlan(h, tokenFile, "main"))
	st := planStep(t, e, "download.model")
	if st.Diff.Action != agent.Create {
		t.Fatalf("first plan: %s, want create", st.Diff.Action)
	}
	mustApply(t, e)
	for _, f := range h.files {
		p := filepath.Join(dest, f.path)
		switch f.path {
		case "README.md", "original/consolidated.safetensors":
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%s downloaded though include/exclude leave it out", f.path)
			}
		default:
			wantContent(t, p, f.data)
		}
	}
	if _, auth := h.cdnBytes(); auth != 0 {
		t.Errorf("the CDN saw Authorization %d times; the token must not follow a redirect to another host", auth)
	}
	stateFile := filepath.Join(dir, ".state", "resources", "download.model.json")
	data, err := os.ReadFile(stateFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), h.token) {
		t.Error("the token was written to state")
	}
	var rec downloadRecord
	json.Unmarshal(data, &rec)
	if rec.Hub == nil || rec.Hub.Commit != h.commit || rec.Progress != nil {
		t.Fatalf("state record %+v: want the resolved commit %s and no progress", rec, h.commit)
	}
	man, _ := os.ReadFile(filepath.Join(dest, ".agent-manifest.json"))
	if !strings.Contains(string(man), h.commit) {
		t.Error("the manifest does not record the commit")
	}

	// A new agent process planning a branch: one small request (the revision), no listing,
	// no data.
	before := h.requests.Load()
	cdnBefore, _ := h.cdnBytes()
	if st := planStep(t, engine(t, dir, hubPlan(h, tokenFile, "main")), "download.model"); st.Diff.Action != agent.NoOp {
		t.Fatalf("plan after apply: %s %+v", st.Diff.Action, st.Diff.Changes)
	}
	if n := h.requests.Load() - before; n != 1 {
		t.Errorf("plan of a converged branch made %d Hub requests, want 1 (resolve only)", n)
	}

	// Pinned to the commit: no request at all, and no data read. The data is changed in
	// place with size and mtime kept: a plan that read it would see it.
	pinned := hubPlan(h, tokenFile, h.commit)
	before = h.requests.Load()
	model := filepath.Join(dest, "model-00001-of-00002.safetensors")
	fi, _ := os.Stat(model)
	f, _ := os.OpenFile(model, os.O_WRONLY, 0)
	f.WriteAt([]byte{0xff, 0xfe}, 100)
	f.Close()
	os.Chtimes(model, fi.ModTime(), fi.ModTime())
	start := time.Now()
	if st := planStep(t, engine(t, dir, pinned), "download.model"); st.Diff.Action != agent.NoOp {
		t.Fatalf("pinned plan: %s %+v", st.Diff.Action, st.Diff.Changes)
	}
	t.Logf("pinned no-op plan took %s", time.Since(start))
	if n := h.requests.Load() - before; n != 0 {
		t.Errorf("plan of a converged pinned download made %d Hub requests, want 0", n)
	}
	if n, _ := h.cdnBytes(); n != cdnBefore {
		t.Errorf("the CDN sent %d bytes during plans, want 0", n-cdnBefore)
	}

	// A touched file (mtime changed) is re-verified, found wrong and re-downloaded alone.
	os.Chtimes(model, time.Now(), time.Now())
	e = engine(t, dir, pinned)
	st = planStep(t, e, "download.model")
	if st.Diff.Action != agent.Update || len(st.Diff.Changes) != 1 || st.Diff.Changes[0].Attr != `file["model-00001-of-00002.safetensors"]` {
		t.Fatalf("plan after touching a file: %s %+v", st.Diff.Action, st.Diff.Changes)
	}
	mustApply(t, e)
	wantContent(t, model, h.files[0].data)
	if n, _ := h.cdnBytes(); n-cdnBefore != int64(len(h.files[0].data)) {
		t.Errorf("re-download fetched %d bytes, want %d (that file alone)", n-cdnBefore, len(h.files[0].data))
	}

	// The branch moves to a commit that changes one shard: the plan names the new commit
	// and that shard alone.
	old := h.commit
	h.mu.Lock()
	h.commit = strings.Repeat("cd", 20)
	h.files[1].data = randBytes(200<<10, 99)
	h.mu.Unlock()
	h.cdn.Set("/cdn/"+sha(h.files[1].data), h.files[1].data)
	st = planStep(t, engine(t, dir, hubPlan(h, tokenFile, "main")), "download.model")
	var attrs []string
	for _, c := range st.Diff.Changes {
		attrs = append(attrs, c.Attr)
	}
	if want := `huggingface.commit file["model-00002-of-00002.safetensors"]`; strings.Join(attrs, " ") != want {
		t.Errorf("plan after the branch moved from %s: %v, want %s", old, attrs, want)
	}
}

// TestDownloadHubMirrorWithoutRevisionAPI: a mirror without the revision API still pins
// the branch to a commit, named by X-Repo-Commit on a resolve URL.
func TestDownloadHubMirrorWithoutRevisionAPI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := newFakeHub(t, hubFiles())
	h.noRevAPI = true
	tokenFile := filepath.Join(dir, "hf-token")
	os.WriteFile(tokenFile, []byte(h.token), 0o644)
	e := engine(t, dir, hubPlan(h, tokenFile, "main"))
	st := planStep(t, e, "download.model")
	if !strings.Contains(strings.Join(st.Diff.Warnings, "\n"), "readable by group or others") {
		t.Errorf("warnings %q: want one about the token file's mode", st.Diff.Warnings)
	}
	for _, w := range st.Diff.Warnings {
		if strings.Contains(w, h.token) {
			t.Error("a warning shows the token")
		}
	}
	mustApply(t, e)
	var rec downloadRecord
	s, _ := state.Open(filepath.Join(dir, ".state"))
	s.Load("download.model", &rec)
	if rec.Hub == nil || rec.Hub.Commit != h.commit {
		t.Fatalf("recorded %+v, want commit %s", rec.Hub, h.commit)
	}
}

// TestDownloadHubRefusesUnsafePaths: a listing with "..", an absolute path or a symlinked
// directory leading out of dest is refused, and nothing is written outside dest.
func TestDownloadHubRefusesUnsafePaths(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"../escape.json", "/etc/evil.json", "a/../../b.json", "link/x.json"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			files := []hubTestFile{{path: "config.json", data: []byte("{}")}, {path: name, data: []byte("{}")}}
			h := newFakeHub(t, files)
			tokenFile := filepath.Join(dir, "hf-token")
			os.WriteFile(tokenFile, []byte(h.token), 0o600)
			outside := filepath.Join(dir, "outside")
			os.MkdirAll(outside, 0o755)
			dest := filepath.Join(dir, "models", "m")
			os.MkdirAll(dest, 0o755)
			os.Symlink(outside, filepath.Join(dest, "link"))
			rep := engine(t, dir, hubPlan(h, tokenFile, "main")).Apply(t.Context(), nil)
			err := rep.Steps[0].Err
			if err == nil || !strings.Contains(err.Error(), "unsafe") {
				t.Fatalf("apply: %v, want an unsafe path refused", err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("wrote outside dest: %v", ents)
			}
		})
	}
}

func explicitPlan(s *fetchtest.Server, files map[string][]byte, extra string) string {
	var b strings.Builder
	b.WriteString("variable \"root\" {}\ndownload \"w\" {\n  dest = \"${var.root}/w\"\n" + extra)
	for _, name := range []string{"a.bin", "b.bin", "c.json"} {
		data, ok := files[name]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "  file %q {\n    url    = %q\n    sha256 = %q\n    size   = %d\n  }\n", name, s.URL("/"+name), sha(data), len(data))
	}
	b.WriteString("}\n")
	return b.String()
}

// TestDownloadCorruptedFileAloneAndExtrasKept: a corrupted file is found (its mtime changed),
// hashed, and re-downloaded alone; a file nobody declared is reported and kept.
func TestDownloadCorruptedFileAloneAndExtrasKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	files := map[string][]byte{"a.bin": randBytes(256<<10, 10), "b.bin": randBytes(128<<10, 11), "c.json": []byte("{}\n")}
	for n, d := range files {
		s.Set("/"+n, d)
	}
	src := explicitPlan(s, files, "")
	mustApply(t, engine(t, dir, src))
	dest := filepath.Join(dir, "w")
	os.WriteFile(filepath.Join(dest, "notes.txt"), []byte("mine"), 0o644)
	corrupt := append([]byte(nil), files["b.bin"]...)
	corrupt[1000] ^= 1
	os.WriteFile(filepath.Join(dest, "b.bin"), corrupt, 0o644)
	sent := map[string]int64{}
	for n := range files {
		sent[n] = s.Stats("/" + n).BytesSent
	}

	e := engine(t, dir, src)
	st := planStep(t, e, "download.w")
	if st.Diff.Action != agent.Update || len(st.Diff.Changes) != 1 || st.Diff.Changes[0].Attr != `file["b.bin"]` {
		t.Fatalf("plan: %s %+v", st.Diff.Action, st.Diff.Changes)
	}
	if w := strings.Join(st.Diff.Warnings, "\n"); !strings.Contains(w, "notes.txt") {
		t.Errorf("warnings %q: want notes.txt reported", w)
	}
	mustApply(t, e)
	wantContent(t, filepath.Join(dest, "b.bin"), files["b.bin"])
	for n := range files {
		got := s.Stats("/"+n).BytesSent - sent[n]
		want := int64(0)
		if n == "b.bin" {
			want = int64(len(files[n]))
		}
		if got != want {
			t.Errorf("%s: %d bytes fetched again, want %d", n, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dest, "notes.txt")); err != nil {
		t.Errorf("extra file deleted: %v", err)
	}
	st = planStep(t, engine(t, dir, src), "download.w")
	if st.Diff.Action != agent.NoOp || len(st.Diff.Warnings) != 1 {
		t.Errorf("plan after repair: %s, warnings %q; want no-op with the extra file reported", st.Diff.Action, st.Diff.Warnings)
	}
}

// TestDownloadWrongContentFailsWithHashes: a server that keeps sending other bytes ends in an
// error naming both hashes, with no file in place.
func TestDownloadWrongContentFailsWithHashes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	data := randBytes(64<<10, 20)
	s.Set("/a.bin", data)
	s.SetFault("/a.bin", fetchtest.Fault{Corrupt: true})
	rep := engine(t, dir, explicitPlan(s, map[string][]byte{"a.bin": data}, "")).Apply(t.Context(), nil)
	err := rep.Steps[0].Err
	if err == nil || !strings.Contains(err.Error(), "expected sha256 "+sha(data)) || !strings.Contains(err.Error(), ", got ") {
		t.Fatalf("apply: %v; want the expected and actual sha256", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "w", "a.bin")); err == nil {
		t.Error("a wrong file is in place")
	}
}

// TestDownloadStatus: status reports verified files and bytes from the manifest, and a
// running apply's bytes, rate and ETA from the progress it records in state.
func TestDownloadStatus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	files := map[string][]byte{"a.bin": randBytes(100<<10, 30), "b.bin": randBytes(50<<10, 31)}
	for n, d := range files {
		s.Set("/"+n, d)
	}
	src := explicitPlan(s, files, "")
	status := func() *agent.Status {
		t.Helper()
		rep := engine(t, dir, src).Status(t.Context())
		if rep.Steps[0].Err != nil {
			t.Fatal(rep.Steps[0].Err)
		}
		return rep.Steps[0].Status
	}
	if st := status(); st.Healthy || !strings.HasPrefix(st.Summary, "incomplete: 0/2 files verified") {
		t.Errorf("before apply: %+v", st)
	}
	// A live apply elsewhere (this process stands in for it) recorded its progress.
	store, _ := state.Open(filepath.Join(dir, ".state"))
	store.Save("download.w", downloadRecord{Progress: &progressRecord{PID: os.Getpid(), Updated: time.Now(), Done: 75 << 10, Total: 150 << 10,
		Rate: 25 << 10, ETASeconds: 3, Files: []fileProgress{{Name: "a.bin", State: "downloading", Done: 75 << 10, Total: 100 << 10, Rate: 25 << 10, ETASeconds: 1}}}})
	st := status()
	if st.Healthy || !strings.Contains(st.Summary, "downloading") || !strings.Contains(st.Summary, "25.0 KiB/s") || !strings.Contains(st.Summary, "ETA 3s") {
		t.Errorf("during a download: %+v", st)
	}
	mustApply(t, engine(t, dir, src))
	st = status()
	if !st.Healthy || st.Summary != "2/2 files verified, 150.0 KiB" {
		t.Errorf("after apply: %+v", st)
	}
	for k, want := range map[string]float64{"files_verified": 2, "files_total": 2, "bytes_done": 150 << 10, "bytes_total": 150 << 10} {
		if st.Metrics[k] != want {
			t.Errorf("Metrics[%s] = %v, want %v", k, st.Metrics[k], want)
		}
	}
}

func TestDownloadBindErrors(t *testing.T) {
	t.Parallel()
	sum := strings.Repeat("0", 64)
	for _, tc := range []struct{ name, body, want string }{
		{"no source", `dest = "/m"`, "No source"},
		{"both", `dest = "/m"
  file "a" {
    url = "https://h/a"
    sha256 = "` + sum + `"
  }
  huggingface { repo = "a/b" }`, "Two sources"},
		{"http", `dest = "/m"
  file "a" {
    url = "http://example.org/a"
    sha256 = "` + sum + `"
  }`, "Insecure URL"},
		{"bad sha", `dest = "/m"
  file "a" {
    url = "https://h/a"
    sha256 = "abc"
  }`, "Invalid sha256"},
		{"unsafe name", `dest = "/m"
  file "../a" {
    url = "https://h/a"
    sha256 = "` + sum + `"
  }`, "Unsafe file name"},
		{"relative dest", `dest = "m"
  huggingface { repo = "a/b" }`, "Relative destination"},
		{"http endpoint", `dest = "/m"
  huggingface {
    repo = "a/b"
    endpoint = "http://mirror.example"
  }`, "Invalid endpoint"},
		{"bad repo", `dest = "/m"
  huggingface { repo = "a/../b" }`, "Invalid repo"},
		{"stall", `dest = "/m"
  stall_timeout = "soon"
  huggingface { repo = "a/b" }`, "Invalid duration"},
		{"connections", `dest = "/m"
  connections = 0
  huggingface { repo = "a/b" }`, "Invalid connections"},
		{"max_connections", `dest = "/m"
  max_connections = 1000
  huggingface { repo = "a/b" }`, "Invalid max_connections"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, diags := restest.BindPlan("download \"x\" {\n  "+tc.body+"\n}\n", kinds())
			if !strings.Contains(diags.Error(), tc.want) {
				t.Errorf("diagnostics %q, want %q", diags.Error(), tc.want)
			}
		})
	}
	// insecure = true allows plain http to any host.
	if _, diags := restest.BindPlan(`download "x" {
  dest     = "/m"
  insecure = true
  file "a" {
    url    = "http://mirror.example/a"
    sha256 = "`+sum+`"
  }
}
`, kinds()); diags.HasErrors() {
		t.Errorf("insecure = true: %v", diags)
	}
}

func TestGlobs(t *testing.T) {
	t.Parallel()
	g, err := compileGlobs([]string{"*.safetensors", "tokenizer*", "original/", "a?c.[jt]xt"})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{
		"model-00001.safetensors": true, "sub/x.safetensors": true, "tokenizer.json": true,
		"tokenizer_config.json": true, "original/params.json": true, "abc.txt": true, "abc.jxt": true,
		"config.json": false, "x/tokenizer.json": false, "abc.md": false,
	} {
		if got := g.match(p); got != want {
			t.Errorf("match(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestNextLink(t *testing.T) {
	t.Parallel()
	base, _ := url.Parse("https://hub.example/api/models/a/b/tree/main?recursive=true")
	got, _ := nextLink(base, []string{`<https://hub.example/api/x?cursor=2>; rel="next", <https://hub.example/api/x?cursor=0>; rel="first"`})
	if got != "https://hub.example/api/x?cursor=2" {
		t.Errorf("next = %q", got)
	}
	got, _ = nextLink(base, []string{`</api/x?cursor=3>; rel=next`})
	if got != "https://hub.example/api/x?cursor=3" {
		t.Errorf("relative next = %q", got)
	}
	if got, _ := nextLink(base, nil); got != "" {
		t.Errorf("no Link: %q", got)
	}
}

// TestDownloadSurvivesSIGKILL kills a real `agent apply` (SIGKILL) in the middle of a
// download, checks that `agent status` in another process saw its progress, restarts it, and
// checks the file completes, is correct, and that the bytes fetched again are under one
// checkpoint (checkpoint_every = 64 KiB here). It runs the single stream (connections = 1);
// the ranges' kill test is fetch's TestKillWithRangesInFlight.
func TestDownloadSurvivesSIGKILL(t *testing.T) {
	testbin.Long(t, "builds the agent binary")
	t.Parallel()
	bin := testbin.Agent(t)
	dir := t.TempDir()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	data := randBytes(4<<20, 40)
	s.Set("/a.bin", data)
	const ckpt, stopAt = 64 << 10, 2<<20 + 1234
	// The first GET sends 2 MiB and a bit, then hangs: the agent is killed there.
	s.SetFault("/a.bin", fetchtest.Fault{Stall: time.Hour, StallAfter: stopAt, Times: 1})
	plan := filepath.Join(dir, "plan.hcl")
	os.WriteFile(plan, []byte(explicitPlan(s, map[string][]byte{"a.bin": data}, "  checkpoint_every = 65536\n  stall_timeout = \"1h\"\n  connections = 1\n")), 0o644)
	run := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, append(args, plan, "--state-dir", filepath.Join(dir, "state"))...)
		cmd.Env = append(os.Environ(), "AGENT_VAR_root="+dir)
		return cmd
	}
	apply := run("apply")
	var out bytes.Buffer
	apply.Stdout, apply.Stderr = &out, &out
	if err := apply.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { apply.Process.Kill() })
	sidecar := filepath.Join(dir, "w", ".a.bin.partial.json")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sc struct{ Offset int64 }
		if b, err := os.ReadFile(sidecar); err == nil && json.Unmarshal(b, &sc) == nil && sc.Offset >= stopAt-ckpt {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint near %d after 30s; agent output:\n%s", stopAt, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// status, from another process, reads the running apply's progress.
	var status string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		b, _ := run("status").Output()
		if status = string(b); strings.Contains(status, "downloading (PID") {
			break
		}
	}
	if !strings.Contains(status, "downloading (PID") || !strings.Contains(status, "ETA") {
		t.Errorf("status during the download:\n%s", status)
	}
	apply.Process.Signal(os.Kill)
	apply.Wait()
	if _, err := os.Stat(filepath.Join(dir, "w", "a.bin")); err == nil {
		t.Fatal("file in place before it was complete")
	}

	if b, err := run("apply").CombinedOutput(); err != nil {
		t.Fatalf("second apply: %v\n%s", err, b)
	}
	wantContent(t, filepath.Join(dir, "w", "a.bin"), data)
	refetch := s.Stats("/a.bin").BytesSent - int64(len(data))
	t.Logf("bytes fetched again after SIGKILL: %d (checkpoint %d)", refetch, ckpt)
	if refetch < 0 || refetch >= ckpt {
		t.Errorf("fetched %d bytes again, want under one checkpoint (%d)", refetch, ckpt)
	}
	if b, err := run("plan").CombinedOutput(); err != nil || !strings.Contains(string(b), "No changes") {
		t.Errorf("plan after resume: %v\n%s", err, b)
	}
}

// TestDownloadRangesThroughExpiringSignedURLs (issue 15): one apply brings a file over
// `connections` ranges at once from a server whose signed URLs expire every 256 KiB and that
// caps each connection: the ranges are in flight together, every expiry is re-resolved
// without exhausting the retries, and nothing is fetched twice.
func TestDownloadRangesThroughExpiringSignedURLs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	files := map[string][]byte{"a.bin": randBytes(6<<20, 20)}
	s.Set("/a.bin", files["a.bin"])
	s.SetFault("/a.bin", fetchtest.Fault{SignedBytes: 256 << 10, Rate: 4 << 20})
	mustApply(t, engine(t, dir, explicitPlan(s, files, "  connections = 6\n  max_connections = 6\n")))
	wantContent(t, filepath.Join(dir, "w", "a.bin"), files["a.bin"])
	st := s.Stats("/a.bin")
	t.Logf("stats %+v", st)
	if st.MaxInFlight < 2 || st.MaxInFlight > 6 {
		t.Errorf("%d ranges at once, want between 2 and connections = 6", st.MaxInFlight)
	}
	if st.Expired == 0 {
		t.Errorf("no signature expired: the test proves nothing")
	}
	if st.BytesSent > int64(len(files["a.bin"]))+6*(256<<10) {
		t.Errorf("%d bytes sent for %d: more than a cut-off signature's worth per connection fetched twice", st.BytesSent, len(files["a.bin"]))
	}
}

// TestDownloadCheckWritesNothing: the listing a Check makes comes back as a record update
// in the diff, never written (issue 24; see restest.CheckWritesNothing).
func TestDownloadCheckWritesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	hub := newFakeHub(t, hubFiles())
	tokenFile := filepath.Join(dir, "hf-token")
	os.WriteFile(tokenFile, []byte(hub.token+"\n"), 0o600)
	store := restest.OpenStore(t, filepath.Join(dir, ".state"))
	d := restest.CheckWritesNothing(t, dir, hubPlan(hub, tokenFile, "main"), kinds(), store, "download.model", "root="+dir)
	if rec, ok := restest.RecordOf[*downloadRecord](d); d.Record == nil || !ok || rec.Hub == nil || rec.Hub.Commit == "" {
		t.Errorf("the listing is not in the diff as a record update: %+v", d.Record)
	}
}
