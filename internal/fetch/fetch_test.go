package fetch_test

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
	"github.com/google/go-cmp/cmp"
)

const ckpt = 64 << 10 // CheckpointEvery in tests

func content(n int, seed uint64) []byte {
	b := make([]byte, n)
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	rand.NewChaCha8(s).Read(b)
	return b
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// testOptions fetch each file as one stream (on grab): the tests of this file are about
// that path; ranged_test.go uses rangedOptions.
func testOptions(dest string) fetch.Options {
	return fetch.Options{
		Dest:            dest,
		Connections:     1,
		CheckpointEvery: ckpt,
		RetryBackoff:    time.Millisecond,
		StallTimeout:    10 * time.Second,
	}
}

func serve(t *testing.T) *fetchtest.Server {
	t.Helper()
	s := fetchtest.NewServer()
	t.Cleanup(s.Close)
	return s
}

// add serves data at /name and returns the File describing it.
func add(s *fetchtest.Server, name string, data []byte) fetch.File {
	s.Set("/"+name, data)
	return fetch.File{Name: name, URL: s.URL("/" + name), Size: int64(len(data)), SHA256: sum(data)}
}

func wantFile(t *testing.T, dest, name string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(dest, filepath.FromSlash(name)))
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	if sum(got) != sum(want) {
		t.Fatalf("%s: content sha256 %s (%d bytes), want %s (%d bytes)", name, sum(got), len(got), sum(want), len(want))
	}
}

func wantAbsent(t *testing.T, dest, name string) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(dest, filepath.FromSlash(name))); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: want no file in place, stat says %v", name, err)
	}
}

func actions(res fetch.Result) map[string]string {
	m := map[string]string{}
	for _, f := range res.Files {
		m[f.Name] = f.Action.String()
	}
	return m
}

func TestFetchDownloadsThenSkipsFromManifest(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	a, b, c := content(300<<10, 1), content(5, 2), content(0, 3)
	files := []fetch.File{add(s, "a.bin", a), add(s, "sub/dir/b.json", b), add(s, "empty", c)}
	var mu sync.Mutex
	var snaps []fetch.Progress
	opts := testOptions(dest)
	opts.Concurrency = 2
	opts.ProgressInterval = time.Millisecond
	opts.Progress = func(p fetch.Progress) {
		mu.Lock()
		defer mu.Unlock()
		snaps = append(snaps, p)
	}
	res, err := fetch.Fetch(t.Context(), files, opts)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	want := map[string]string{"a.bin": "downloaded", "sub/dir/b.json": "downloaded", "empty": "downloaded"}
	if diff := cmp.Diff(want, actions(res)); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	wantFile(t, dest, "a.bin", a)
	wantFile(t, dest, "sub/dir/b.json", b)
	wantFile(t, dest, "empty", c)
	if res.Fetched != int64(len(a)+len(b)) {
		t.Errorf("Fetched = %d, want %d", res.Fetched, len(a)+len(b))
	}

	mu.Lock()
	last := snaps[len(snaps)-1]
	mu.Unlock()
	if !last.Final || last.Done != last.Total || last.Total != int64(len(a)+len(b)) {
		t.Errorf("final progress = %+v, want Final with Done == Total == %d", last, len(a)+len(b))
	}
	for _, fp := range last.Files {
		if fp.State != fetch.FileDone {
			t.Errorf("final progress of %s: state %s, want done", fp.Name, fp.State)
		}
	}

	fi, err := os.Stat(filepath.Join(dest, ".agent-manifest.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("manifest: %v, mode %v; want 0600", err, fi.Mode())
	}
	leftovers, _ := filepath.Glob(filepath.Join(dest, "*.partial*"))
	if len(leftovers) != 0 {
		t.Errorf("partial files left: %v", leftovers)
	}

	// A second Fetch is a no-op proven by the manifest: no request at all.
	before := s.Stats("/a.bin").Requests
	res, err = fetch.Fetch(t.Context(), files, testOptions(dest))
	if err != nil {
		t.Fatalf("second Fetch: %v", err)
	}
	want = map[string]string{"a.bin": "skipped", "sub/dir/b.json": "skipped", "empty": "skipped"}
	if diff := cmp.Diff(want, actions(res)); diff != "" {
		t.Errorf("second Fetch actions (-want +got):\n%s", diff)
	}
	if got := s.Stats("/a.bin").Requests; got != before {
		t.Errorf("second Fetch made %d requests, want none", got-before)
	}
}

// TestFaults: each fault ends in a correct file or a clear error, never a wrong file in place.
func TestFaults(t *testing.T) {
	t.Parallel()
	const size = 512 << 10
	data := content(size, 10)
	next := content(size, 11)
	bigger := content(size+12345, 12)
	tests := []struct {
		name  string
		fault fetchtest.Fault
		// expect is what the file should end as (nil: an error and no file).
		expect       []byte
		unknownSize  bool
		wantErr      error
		wantErrText  []string
		wantRestarts int
		// maxRefetch bounds the bytes sent beyond one copy of the file (-1: no bound).
		maxRefetch int64
	}{
		{name: "connection dropped resumes", fault: fetchtest.Fault{DropAfter: 200 << 10, Times: 1}, expect: data, maxRefetch: ckpt},
		{name: "dropped twice resumes twice", fault: fetchtest.Fault{DropAfter: 100 << 10, Times: 2}, expect: data, maxRefetch: 2 * ckpt},
		{name: "Content-Length lies short once", fault: fetchtest.Fault{Truncate: 1000, Times: 1}, expect: data, maxRefetch: -1},
		{name: "Content-Length lies short, size unknown", fault: fetchtest.Fault{Truncate: 1000, Times: 1}, expect: data, unknownSize: true, maxRefetch: -1},
		{name: "wrong content once is retried", fault: fetchtest.Fault{Corrupt: true, Times: 1}, expect: data, maxRefetch: size},
		{name: "wrong content always fails with both hashes", fault: fetchtest.Fault{Corrupt: true},
			wantErr: fetch.ErrChecksum, wantErrText: []string{"expected sha256 " + sum(data), "got "}, maxRefetch: -1},
		{name: "200 to a range request restarts from zero", fault: fetchtest.Fault{IgnoreRange: true, DropAfter: 100 << 10, Times: 1},
			expect: data, wantRestarts: 1, maxRefetch: -1},
		{name: "stall is aborted and resumed", fault: fetchtest.Fault{Stall: time.Minute, StallAfter: 150 << 10, Times: 1}, expect: data, maxRefetch: ckpt},
		{name: "server without ranges, no fault", fault: fetchtest.Fault{IgnoreRange: true}, expect: data, maxRefetch: 0},
		{name: "gzip is refused", fault: fetchtest.Fault{Gzip: true}, wantErr: fetch.ErrCompressed, maxRefetch: -1},
		{name: "gzip once then identity", fault: fetchtest.Fault{Gzip: true, Times: 1}, expect: data, maxRefetch: -1},
		{name: "changed ETag on 206 restarts", fault: fetchtest.Fault{DropAfter: 100 << 10, Times: 1, ChangeAfter: 1, Next: next, IgnoreIfRange: true},
			expect: next, wantRestarts: 1, maxRefetch: -1},
		{name: "changed ETag with If-Range restarts", fault: fetchtest.Fault{DropAfter: 100 << 10, Times: 1, ChangeAfter: 1, Next: next},
			expect: next, wantRestarts: 1, maxRefetch: -1},
		{name: "changed size restarts", fault: fetchtest.Fault{DropAfter: 100 << 10, Times: 1, ChangeAfter: 1, Next: bigger, IgnoreIfRange: true},
			expect: bigger, unknownSize: true, wantRestarts: 1, maxRefetch: -1},
		{name: "changed content with the old sha fails", fault: fetchtest.Fault{DropAfter: 100 << 10, Times: 1, ChangeAfter: 1, Next: next},
			wantErr: fetch.ErrChecksum, maxRefetch: -1},
		// Neither HEAD nor ranges: the partial file must start over, and that is a restart
		// (its sidecar goes first, so no crash pairs the old hash state with new bytes).
		{name: "no HEAD, no ranges: a drop restarts from zero", fault: fetchtest.Fault{RefuseHEAD: true, IgnoreRange: true, DropAfter: 200 << 10, Times: 1},
			expect: data, wantRestarts: 1, maxRefetch: -1},
		// A 503 to the HEAD that precedes a resume used to send grab to a plain GET whose
		// whole file replaced the partial one.
		{name: "busy HEAD keeps the partial", fault: fetchtest.Fault{DropAfter: 200 << 10, Times: 1, BusyHEAD: 2}, expect: data, maxRefetch: ckpt},
		// A close-delimited body cut short ends without an error: its bytes are hashed and
		// correct, and used to be thrown away as a size mismatch.
		{name: "body ending cleanly but short resumes", fault: fetchtest.Fault{EndCleanlyAfter: 200 << 10, Times: 1}, expect: data, maxRefetch: ckpt},
		// No Content-Length and no end: reading stops at the file's size instead of filling
		// the disk (every case's server may send at most 64 MiB, below); the bytes up to
		// the size are the file, and the sha256 says so.
		{name: "body longer than the file is cut off at its size", fault: fetchtest.Fault{Overflow: 256 << 20}, expect: data, maxRefetch: -1},
		{name: "longer body of the wrong file is cut off and fails", fault: fetchtest.Fault{Overflow: 256 << 20, Corrupt: true},
			wantErr: fetch.ErrChecksum, maxRefetch: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			f := add(s, "model.bin", data)
			if tc.expect != nil {
				f.SHA256 = sum(tc.expect)
			}
			if tc.unknownSize {
				f.Size = -1
			}
			s.SetFault("/model.bin", tc.fault)
			opts := testOptions(dest)
			if tc.fault.Stall > 0 {
				// Only the stall case needs a short timeout; elsewhere it would flake
				// on a loaded machine.
				opts.StallTimeout = 200 * time.Millisecond
			}
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
			fr := res.Files[0]
			if sent := s.Stats("/model.bin").BytesSent; sent > 64<<20 {
				t.Errorf("the server got to send %d bytes for a %d-byte file", sent, size)
			}
			if tc.expect == nil {
				if err == nil {
					t.Fatalf("Fetch succeeded, want an error")
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Errorf("error %v, want %v", err, tc.wantErr)
				}
				for _, s := range tc.wantErrText {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not say %q", err, s)
					}
				}
				wantAbsent(t, dest, "model.bin")
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", tc.expect)
			if fr.Restarts != tc.wantRestarts {
				t.Errorf("Restarts = %d, want %d", fr.Restarts, tc.wantRestarts)
			}
			st := s.Stats("/model.bin")
			if refetch := st.BytesSent - int64(len(tc.expect)); tc.maxRefetch >= 0 && refetch > tc.maxRefetch {
				t.Errorf("server sent %d bytes beyond one copy, want at most %d (stats %+v)", refetch, tc.maxRefetch, st)
			}
			t.Logf("attempts %d, restarts %d, stats %+v", fr.Attempts, fr.Restarts, st)
		})
	}
}

// TestResumeAfterCancel stops a Fetch mid-file and shows a fresh Fetch resumes from the
// partial file instead of starting over.
func TestResumeAfterCancel(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	data := content(2<<20, 20)
	f := add(s, "model.bin", data)
	// The first GET stops sending after 1 MiB + a bit and hangs; the test cancels then.
	const stopAt = 1<<20 + 5000
	s.SetFault("/model.bin", fetchtest.Fault{Stall: time.Hour, StallAfter: stopAt, Times: 1})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	opts := testOptions(dest)
	opts.StallTimeout = time.Hour
	opts.ProgressInterval = time.Millisecond
	opts.Progress = func(p fetch.Progress) {
		if p.Done >= stopAt {
			cancel()
		}
	}
	if _, err := fetch.Fetch(ctx, []fetch.File{f}, opts); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Fetch: %v, want context.Canceled", err)
	}
	wantAbsent(t, dest, "model.bin")

	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
	if err != nil {
		t.Fatalf("resumed Fetch: %v", err)
	}
	wantFile(t, dest, "model.bin", data)
	if got := res.Files[0].ResumedFrom; got < stopAt-ckpt {
		t.Errorf("resumed from %d, want at least %d", got, stopAt-ckpt)
	}
	if refetch := s.Stats("/model.bin").BytesSent - int64(len(data)); refetch >= ckpt {
		t.Errorf("re-fetched %d bytes, want less than one checkpoint (%d)", refetch, ckpt)
	}
}

// TestResumeAfterKill kills a fetching process with SIGKILL after it wrote a few checkpoints,
// then resumes in this process: at most one checkpoint's worth of bytes is fetched again.
func TestResumeAfterKill(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	data := content(1<<20, 30)
	f := add(s, "model.bin", data)
	// Checkpoints land near every 64 KiB; stopping 16 KiB past one leaves bytes beyond the
	// last checkpoint in the partial file, which the resume must truncate and fetch again.
	const stallAt = 4*ckpt + 16<<10
	s.SetFault("/model.bin", fetchtest.Fault{Stall: time.Hour, StallAfter: stallAt, Times: 1})

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec(t, exe, "-test.run=^$", "FETCH_HELPER_URL="+f.URL, "FETCH_HELPER_SHA="+f.SHA256, "FETCH_HELPER_DEST="+dest)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait (with a deadline) until the helper's last checkpoint is within one checkpoint
	// of the stall, then kill it. It gets there once it has read every byte the server
	// sent: a Read at the stall checkpoints first when a checkpoint is due. Killing
	// earlier (while the bytes up to the stall sit in socket buffers) would charge the
	// resume for bytes the helper never read, since the server counts all it sent.
	sidecar := filepath.Join(dest, ".model.bin.partial.json")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var sc struct{ Offset int64 }
		if b, err := os.ReadFile(sidecar); err == nil && json.Unmarshal(b, &sc) == nil && sc.Offset > stallAt-ckpt {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("helper did not checkpoint past %d bytes", stallAt-ckpt)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	var sc struct{ Offset int64 }
	b, err := os.ReadFile(sidecar)
	if err != nil || json.Unmarshal(b, &sc) != nil {
		t.Fatalf("sidecar after kill: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dest, ".model.bin.partial"))
	if err != nil || fi.Size() < sc.Offset {
		t.Fatalf("partial file after kill: %v (size %d, checkpoint %d)", err, fi.Size(), sc.Offset)
	}
	t.Logf("killed with partial %d bytes, checkpoint at %d", fi.Size(), sc.Offset)
	// Where the kill lands relative to the last checkpoint depends on read sizes; make sure
	// the partial file holds bytes the checkpoint does not cover, as after a crash mid-write.
	pf, err := os.OpenFile(filepath.Join(dest, ".model.bin.partial"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	pf.Write(content(10<<10, 31))
	pf.Close()

	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
	if err != nil {
		t.Fatalf("resumed Fetch: %v", err)
	}
	wantFile(t, dest, "model.bin", data)
	if res.Files[0].ResumedFrom != sc.Offset {
		t.Errorf("resumed from %d, want the checkpoint %d", res.Files[0].ResumedFrom, sc.Offset)
	}
	st := s.Stats("/model.bin")
	if refetch := st.BytesSent - int64(len(data)); refetch >= ckpt {
		t.Errorf("re-fetched %d bytes, want less than one checkpoint (%d)", refetch, ckpt)
	}
}

// TestMain lets the test binary be the fetching process TestResumeAfterKill kills: with
// FETCH_HELPER_URL set it fetches, never runs a test, and waits to be killed.
func TestMain(m *testing.M) {
	if u := os.Getenv("FETCH_HELPER_URL"); u != "" {
		opts := testOptions(os.Getenv("FETCH_HELPER_DEST"))
		size := int64(1 << 20)
		if os.Getenv("FETCH_HELPER_RANGED") != "" {
			opts = rangedOptions(os.Getenv("FETCH_HELPER_DEST"))
			opts.Connections = killConnections
			opts.CheckpointEvery = killCheckpoint
			size = killSize
		}
		opts.StallTimeout = time.Hour
		f := fetch.File{Name: "model.bin", URL: u, Size: size, SHA256: os.Getenv("FETCH_HELPER_SHA")}
		fetch.Fetch(context.Background(), []fetch.File{f}, opts)
		fmt.Fprintln(os.Stderr, "helper was not killed")
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func TestAuthorizationNotSentToRedirectTarget(t *testing.T) {
	t.Parallel()
	origin, cdn := serve(t), serve(t)
	dest := t.TempDir()
	data := content(200<<10, 40)
	f := add(origin, "model.bin", data)
	cdn.Set("/model.bin", data)
	origin.SetFault("/model.bin", fetchtest.Fault{RequireAuth: "Bearer s3cret", RedirectTo: strings.Replace(cdn.URL(""), "127.0.0.1", "localhost", 1)})
	cdn.SetFault("/model.bin", fetchtest.Fault{DenyAuth: true, DropAfter: 50 << 10, Times: 1})
	f.Header = http.Header{"Authorization": {"Bearer s3cret"}}
	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	wantFile(t, dest, "model.bin", data)
	if got := origin.Stats("/model.bin").AuthSeen; got == 0 {
		t.Errorf("origin saw no Authorization header")
	}
	if st := cdn.Stats("/model.bin"); st.AuthSeen != 0 || st.GETs == 0 {
		t.Errorf("redirect target stats %+v: want GETs and no Authorization", st)
	}
	if res.Files[0].Attempts < 2 {
		t.Errorf("attempts = %d, want the resume through the redirect too", res.Files[0].Attempts)
	}
}

func TestRefusesUnsafeNames(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := filepath.Join(t.TempDir(), "dest")
	outside := t.TempDir()
	if err := os.MkdirAll(dest, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dest, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dest, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(dest, "inside")); err != nil {
		t.Fatal(err)
	}
	data := content(10, 50)
	for _, name := range []string{"../evil", "a/../../evil", "/etc/evil", outside + "/evil", "", "a/./b", "a//b",
		"escape/evil", "escape/sub/evil", ".agent-manifest.json", "x/.y.partial", ".y.partial.json"} {
		t.Run(name, func(t *testing.T) {
			f := add(s, "f", data)
			f.Name = name
			_, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
			if !errors.Is(err, fetch.ErrUnsafeName) {
				t.Fatalf("Fetch(%q): %v, want ErrUnsafeName", name, err)
			}
			t.Logf("%v", err)
		})
	}
	entries, _ := os.ReadDir(outside)
	if len(entries) != 0 || s.Stats("/f").Requests != 0 {
		t.Fatalf("something was written outside (%v) or fetched (%d requests)", entries, s.Stats("/f").Requests)
	}
	// A symlink that stays inside Dest is fine.
	f := add(s, "f", data)
	f.Name = "inside/ok"
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest)); err != nil {
		t.Fatalf("Fetch through an inside symlink: %v", err)
	}
	wantFile(t, dest, "real/ok", data)
}

func TestURLPolicy(t *testing.T) {
	t.Parallel()
	s := serve(t)
	data := content(10, 60)
	for _, u := range []string{"http://example.invalid/x", "ftp://127.0.0.1/x", "file:///etc/passwd"} {
		f := fetch.File{Name: "x", URL: u, Size: 10, SHA256: sum(data)}
		if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(t.TempDir())); !errors.Is(err, fetch.ErrInsecureURL) {
			t.Errorf("Fetch(%s): %v, want ErrInsecureURL", u, err)
		}
	}
	// A redirect from loopback to plain http elsewhere is refused before it is followed.
	f := add(s, "r", data)
	s.SetFault("/r", fetchtest.Fault{RedirectTo: "http://example.invalid"})
	opts := testOptions(t.TempDir())
	opts.Retries = -1
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts); !errors.Is(err, fetch.ErrInsecureURL) {
		t.Errorf("insecure redirect: %v, want ErrInsecureURL", err)
	}
	// Unverified files need an explicit allowance.
	f = add(s, "u", data)
	f.SHA256, f.Size = "", -1
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(t.TempDir())); !errors.Is(err, fetch.ErrUnverified) {
		t.Errorf("unverified: %v, want ErrUnverified", err)
	}
	opts = testOptions(t.TempDir())
	opts.AllowUnverified = true
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts); err != nil {
		t.Errorf("allowed unverified: %v", err)
	}
}

func TestFreeSpaceCheckedFirst(t *testing.T) {
	t.Parallel()
	s := serve(t)
	f := add(s, "huge", content(10, 70))
	f.Size = 1 << 60
	_, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(t.TempDir()))
	if !errors.Is(err, fetch.ErrNoSpace) || !strings.Contains(err.Error(), fmt.Sprintf("(%d bytes)", 1<<60+256<<20)) {
		t.Fatalf("Fetch: %v, want ErrNoSpace with the numbers", err)
	}
	if n := s.Stats("/huge").Requests; n != 0 {
		t.Errorf("%d requests before the space check failed", n)
	}
}

// TestCheck pins Check's contract: size and mtime against the manifest, never the data.
func TestCheck(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	a, b := content(100<<10, 80), content(50<<10, 81)
	files := []fetch.File{add(s, "a", a), add(s, "d/b", b)}
	if _, err := fetch.Fetch(t.Context(), files, testOptions(dest)); err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	states := func() map[string]string {
		t.Helper()
		res, err := fetch.Check(t.Context(), dest, files)
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		m := map[string]string{}
		for _, f := range res.Files {
			m[f.Name] = f.State.String()
		}
		return m
	}
	if diff := cmp.Diff(map[string]string{"a": "ok", "d/b": "ok"}, states()); diff != "" {
		t.Fatalf("after Fetch (-want +got):\n%s", diff)
	}

	// Same size, same mtime, other bytes: Check (and Fetch) still say OK. This is the
	// contract: a converged download is confirmed from stat alone, without reading 52 GB.
	pa := filepath.Join(dest, "a")
	fi, _ := os.Stat(pa)
	if err := os.WriteFile(pa, content(100<<10, 99), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(pa, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"a": "ok", "d/b": "ok"}, states()); diff != "" {
		t.Fatalf("after same-size same-mtime change (-want +got):\n%s", diff)
	}

	// A changed mtime asks for verification; Fetch hashes, finds it wrong, downloads it.
	later := fi.ModTime().Add(time.Hour)
	os.Chtimes(pa, later, later)
	// b keeps its bytes but gets a new mtime: Fetch hashes it and downloads nothing.
	pb := filepath.Join(dest, "d", "b")
	os.Chtimes(pb, later, later)
	if diff := cmp.Diff(map[string]string{"a": "verify", "d/b": "verify"}, states()); diff != "" {
		t.Fatalf("after mtime change (-want +got):\n%s", diff)
	}
	getsB := s.Stats("/d/b").GETs
	res, err := fetch.Fetch(t.Context(), files, testOptions(dest))
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if diff := cmp.Diff(map[string]string{"a": "downloaded", "d/b": "verified"}, actions(res)); diff != "" {
		t.Errorf("re-verification actions (-want +got):\n%s", diff)
	}
	if got := s.Stats("/d/b").GETs; got != getsB {
		t.Errorf("verified file was downloaded again")
	}
	wantFile(t, dest, "a", a)
	if diff := cmp.Diff(map[string]string{"a": "ok", "d/b": "ok"}, states()); diff != "" {
		t.Fatalf("after re-verification (-want +got):\n%s", diff)
	}

	// Missing and extra files.
	os.Remove(pb)
	os.WriteFile(filepath.Join(dest, "notes.txt"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dest, "d", ".old.partial"), []byte("x"), 0o644)
	res2, err := fetch.Check(t.Context(), dest, files)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Converged() || res2.Files[1].State != fetch.StateMissing {
		t.Errorf("after removing d/b: %+v", res2.Files)
	}
	if diff := cmp.Diff([]string{"d/.old.partial", "notes.txt"}, res2.Extra); diff != "" {
		t.Errorf("Extra (-want +got):\n%s", diff)
	}
	if _, err := fetch.Fetch(t.Context(), files, testOptions(dest)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dest, "notes.txt")); err != nil {
		t.Errorf("extra file was touched: %v", err)
	}
}

func TestLockedDestination(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	data := content(300<<10, 90)
	f := add(s, "m", data)
	s.SetFault("/m", fetchtest.Fault{Stall: time.Hour, StallAfter: 1000, Times: 1})
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan struct{})
	var once sync.Once
	opts := testOptions(dest)
	opts.StallTimeout = time.Hour
	opts.ProgressInterval = time.Millisecond
	opts.Progress = func(p fetch.Progress) {
		if p.Done > 0 {
			once.Do(func() { close(started) })
		}
	}
	done := make(chan error)
	go func() {
		_, err := fetch.Fetch(ctx, []fetch.File{f}, opts)
		done <- err
	}()
	<-started
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest)); !errors.Is(err, fetch.ErrLocked) {
		t.Errorf("second Fetch: %v, want ErrLocked", err)
	}
	cancel()
	<-done
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	s := serve(t)
	f := add(s, "secret", content(10, 110))
	s.SetFault("/secret", fetchtest.Fault{RequireAuth: "Bearer right"})
	f.Header = http.Header{"Authorization": {"Bearer wrong"}}
	_, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(t.TempDir()))
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("Fetch: %v, want the 401", err)
	}
	if n := s.Stats("/secret").Requests; n != 1 {
		t.Errorf("%d requests, want 1: a 401 is not retried", n)
	}
}

// TestResumeWithoutHEAD: a server that refuses HEAD (405) still gets a resumed transfer:
// fetch probes with a one-byte range GET instead, and the resumed response is checked as any.
func TestResumeWithoutHEAD(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault fetchtest.Fault
	}{
		{"405", fetchtest.Fault{RefuseHEAD: true, DropAfter: 1<<20 + 100, Times: 1}},
		{"405 then 200 on resume", fetchtest.Fault{RefuseHEAD: true, IgnoreRange: true, DropAfter: 1<<20 + 100, Times: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			data := content(2<<20, 31)
			f := add(s, "model.bin", data)
			s.SetFault("/model.bin", tc.fault)
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", data)
			st := s.Stats("/model.bin")
			refetch := st.BytesSent - int64(len(data))
			if tc.fault.IgnoreRange {
				// No range support: the second attempt restarts from zero, never appends.
				if res.Files[0].Restarts+res.Files[0].Attempts < 2 {
					t.Errorf("result %+v: want a second attempt", res.Files[0])
				}
				return
			}
			if st.HEADs == 0 || st.RangeGETs < 2 {
				t.Errorf("stats %+v: want a refused HEAD, a probe and a range GET", st)
			}
			if refetch >= ckpt+1 {
				t.Errorf("re-fetched %d bytes, want under one checkpoint (%d) plus the probe's byte", refetch, ckpt)
			}
		})
	}
}

// A file verified and renamed into place whose manifest entry cannot be written is not
// fetched again: the error says it is in place, and the next run verifies it by reading.
func TestManifestFailureDoesNotRefetch(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	data := content(256<<10, 40)
	f := add(s, "model.bin", data)
	// The manifest is written through a temporary file; a directory in its way fails it.
	if err := os.Mkdir(filepath.Join(dest, ".agent-manifest.json.tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
	if err == nil || !strings.Contains(err.Error(), "model.bin is in place and verified, but recording it in the manifest failed") {
		t.Fatalf("Fetch = %v, want the manifest failure, saying the file is in place", err)
	}
	wantFile(t, dest, "model.bin", data)
	if st := s.Stats("/model.bin"); st.GETs != 1 {
		t.Errorf("%d GETs, want 1: a verified file was fetched again", st.GETs)
	}

	if err := os.Remove(filepath.Join(dest, ".agent-manifest.json.tmp")); err != nil {
		t.Fatal(err)
	}
	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
	if err != nil {
		t.Fatalf("next run: %v", err)
	}
	if st := s.Stats("/model.bin"); st.GETs != 1 || res.Files[0].Fetched != 0 {
		t.Errorf("next run fetched %d bytes (%d GETs), want it to verify the file in place", res.Files[0].Fetched, st.GETs)
	}
}

// Files a Hub repository keeps in git have a git blob id and no sha256: they are
// verified by it before the rename, and a wrong one never lands in place.
func TestGitBlobVerifiedBeforeRename(t *testing.T) {
	t.Parallel()
	data := []byte(`{"architectures": ["Qwen3ForCausalLM"]}` + "\n")
	blob := func(b []byte) string {
		h := sha1.New()
		fmt.Fprintf(h, "blob %d\x00", len(b))
		h.Write(b)
		return hex.EncodeToString(h.Sum(nil))
	}
	for _, tc := range []struct {
		name    string
		gitBlob string
		wantErr string
	}{
		{"right blob", blob(data), ""},
		{"wrong blob", blob([]byte("something else")), "checksum mismatch: expected git blob " + blob([]byte("something else")) + ", got " + blob(data)},
		{"not a blob id", "abc", `git blob "abc" is not 40 lower-case hex digits`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			f := add(s, "config.json", data)
			f.SHA256, f.GitBlob = "", tc.gitBlob // no AllowUnverified: the blob is the check
			_, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(dest))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				wantFile(t, dest, "config.json", data)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Fetch = %v, want %q", err, tc.wantErr)
			}
			wantAbsent(t, dest, "config.json")
		})
	}
}
