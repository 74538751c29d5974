package fetch

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-dev/agent/internal/fetch/fetchtest"
	"github.com/google/go-cmp/cmp"
)

func TestParseContentRange(t *testing.T) {
	t.Parallel()
	type rng struct{ Start, End, Total int64 }
	tests := []struct {
		in   string
		want rng
		ok   bool
	}{
		{"bytes 0-99/100", rng{0, 99, 100}, true},
		{"bytes 100-199/*", rng{100, 199, -1}, true},
		{"bytes 5-4/100", rng{}, false},
		{"bytes 0-100/100", rng{}, false},
		{"bytes */100", rng{}, false},
		{"items 0-1/2", rng{}, false},
		{"", rng{}, false},
	}
	for _, tc := range tests {
		s, e, n, err := parseContentRange(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseContentRange(%q) error %v, want ok=%v", tc.in, err, tc.ok)
			continue
		}
		if diff := cmp.Diff(tc.want, rng{s, e, n}); tc.ok && diff != "" {
			t.Errorf("parseContentRange(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	for name, ok := range map[string]bool{
		"model.safetensors": true, "tokenizer/vocab.json": true, ".gitattributes": true, "a..b": true,
		"": false, "..": false, "../x": false, "a/../x": false, "/abs": false, "a//b": false, "./a": false,
		"a/": false, "a\x00b": false, ".agent-manifest.json": false, ".agent-fetch.lock": false,
		"d/.x.partial": false, ".x.partial.json": false,
	} {
		err := checkName(name)
		if (err == nil) != ok {
			t.Errorf("checkName(%q) = %v, want ok=%v", name, err, ok)
		}
		if err != nil && !errors.Is(err, ErrUnsafeName) {
			t.Errorf("checkName(%q) = %v, want ErrUnsafeName", name, err)
		}
	}
}

// TestUntrustedPartialIsDiscarded: a partial file without a sidecar, or whose sidecar belongs
// to another URL or digest, is never resumed.
func TestUntrustedPartialIsDiscarded(t *testing.T) {
	t.Parallel()
	dest := t.TempDir()
	r, err := newRun(dest, Options{}.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	f := File{Name: "m", URL: "https://example.com/m", Size: 10, SHA256: "00"}
	part := filepath.Join(dest, ".m.partial")
	os.WriteFile(part, []byte("garbage"), 0o600)
	st, err := r.loadPartial(f)
	if err != nil || st.off != 0 {
		t.Fatalf("loadPartial without sidecar: off %v, err %v", st, err)
	}
	if _, err := os.Stat(part); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("partial without sidecar kept: %v", err)
	}

	// A real checkpoint at 4 bytes, then the partial grows past it with unhashed bytes.
	os.WriteFile(part, []byte("abcd"), 0o600)
	st = freshState(f)
	st.h.Write([]byte("abcd"))
	st.off = 4
	if st.fd, err = os.OpenFile(part, os.O_RDWR, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.checkpoint(f, st); err != nil {
		t.Fatal(err)
	}
	st.fd.Close()
	os.WriteFile(part, []byte("abcdXYZ"), 0o600)
	got, err := r.loadPartial(f)
	if err != nil || got.off != 4 {
		t.Fatalf("loadPartial: %+v, %v; want offset 4", got, err)
	}
	if b, _ := os.ReadFile(part); string(b) != "abcd" {
		t.Errorf("partial not truncated to the checkpoint: %q", b)
	}

	// The same partial under another URL is not resumed.
	g := f
	g.URL = "https://example.com/other"
	if got, _ := r.loadPartial(g); got.off != 0 {
		t.Errorf("partial of another URL resumed at %d", got.off)
	}
}

// TestCompletePartialIsFinishedWithoutGET: a crash after the last byte but before the rename
// leaves a complete partial file with a checkpoint at its end. grab's HEAD shows it complete,
// and the file is verified from the checkpointed hash state and renamed, with no GET; if the
// server's ETag changed meanwhile, the file restarts from zero instead.
func TestCompletePartialIsFinishedWithoutGET(t *testing.T) {
	t.Parallel()
	for _, changed := range []bool{false, true} {
		s := fetchtest.NewServer()
		defer s.Close()
		dest := t.TempDir()
		data := []byte("the whole model, already downloaded")
		s.Set("/m", data)
		sum := sha256.Sum256(data)
		f := File{Name: "m", URL: s.URL("/m"), Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}

		r, err := newRun(dest, Options{}.withDefaults())
		if err != nil {
			t.Fatal(err)
		}
		part := filepath.Join(dest, ".m.partial")
		os.WriteFile(part, data, 0o600)
		st := freshState(f)
		st.h.Write(data)
		st.off, st.etag = int64(len(data)), fetchtest.ETag(data)
		if changed {
			st.etag = `"older"`
		}
		st.fd, _ = os.OpenFile(part, os.O_RDWR, 0)
		if err := r.checkpoint(f, st); err != nil {
			t.Fatal(err)
		}
		st.fd.Close()
		r.close()

		res, err := Fetch(t.Context(), []File{f}, Options{Dest: dest})
		if err != nil {
			t.Fatalf("changed=%v: Fetch: %v", changed, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dest, "m")); string(b) != string(data) {
			t.Fatalf("changed=%v: content %q", changed, b)
		}
		wantGETs, wantRestarts := 0, 0
		if changed {
			wantGETs, wantRestarts = 1, 1
		}
		if st := s.Stats("/m"); st.GETs != wantGETs || res.Files[0].Restarts != wantRestarts {
			t.Errorf("changed=%v: %d GETs, %d restarts; want %d, %d", changed, st.GETs, res.Files[0].Restarts, wantGETs, wantRestarts)
		}
	}
}
