package fetch_test

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
)

// TestMirrors: files are asked from the mirrors first and verified exactly as from their
// own URL; a mirror that misses a file, one that sends a wrong copy and one that is down
// are passed over for that file only, and the file lands verified from the next source.
// The origin is asked only for what no mirror could give, and the origin's Authorization
// never reaches a mirror.
func TestMirrors(t *testing.T) {
	t.Parallel()
	names := []string{"a.bin", "b.bin", "dir/c.bin"}
	const size = 2 << 20
	for _, ranged := range []bool{true, false} {
		for _, tc := range []struct {
			name string
			// mirrors builds the mirror URLs (given a healthy mirror holding every file);
			// mirrorFault is set on b.bin of the healthy mirror.
			down        bool
			missing     bool
			stale       bool // b.bin on the mirror is another version, of another size
			mirrorFault fetchtest.Fault
			// originFiles is which files the origin must send (once each).
			originFiles []string
			wantErr     error
		}{
			{name: "all from the mirror"},
			{name: "a mirror that misses a file", missing: true, originFiles: []string{"b.bin"}},
			{name: "a mirror that lies", mirrorFault: fetchtest.Fault{Corrupt: true}, originFiles: []string{"b.bin"}, wantErr: fetch.ErrChecksum},
			{name: "a mirror that is down, then a good one", down: true},
			{name: "a mirror that answers 503", mirrorFault: fetchtest.Fault{Busy: 1000}, originFiles: []string{"b.bin"}},
			{name: "a mirror with a stale copy", stale: true, originFiles: []string{"b.bin"}},
		} {
			t.Run(fmt.Sprintf("%s, ranged %v", tc.name, ranged), func(t *testing.T) {
				t.Parallel()
				origin, mirror := serve(t), serve(t)
				dest := t.TempDir()
				var files []fetch.File
				data := map[string][]byte{}
				for i, n := range names {
					data[n] = content(size, uint64(100+i))
					f := add(origin, n, data[n])
					f.Header = http.Header{"Authorization": {"Bearer origin-only"}}
					switch {
					case tc.missing && n == "b.bin":
					case tc.stale && n == "b.bin":
						mirror.Set("/models/qwen/"+n, content(size+1000, 99))
					default:
						mirror.Set("/models/qwen/"+n, data[n])
					}
					f.Mirrors = []string{mirror.URL("/models/qwen/" + n)}
					if tc.down {
						f.Mirrors = append([]string{downURL(t) + "/models/qwen/" + n}, f.Mirrors...)
					}
					files = append(files, f)
				}
				mirror.SetFault("/models/qwen/b.bin", tc.mirrorFault)
				opts := testOptions(dest)
				if ranged {
					opts = rangedOptions(dest)
				}
				opts.RetryBackoff = time.Second // a mirror that fails is passed over without a wait
				start := time.Now()
				res, err := fetch.Fetch(t.Context(), files, opts)
				took := time.Since(start)
				if err != nil {
					t.Fatalf("Fetch: %v", err)
				}
				for i, n := range names {
					fr := res.Files[i]
					wantFile(t, dest, n, data[n])
					fromOrigin := strings.Contains(strings.Join(tc.originFiles, ","), n)
					st := origin.Stats("/" + n)
					t.Logf("%s: from %s, mirror errors %v, origin stats %+v", n, fr.From, fr.MirrorErrors, st)
					if st.AuthSeen > 0 && !fromOrigin {
						t.Errorf("%s: the origin was asked though the mirror holds it", n)
					}
					if ms := mirror.Stats("/models/qwen/" + n); ms.AuthSeen > 0 {
						t.Errorf("%s: the origin's Authorization reached the mirror", n)
					}
					switch {
					case fromOrigin:
						if fr.From != files[i].URL || st.BytesSent != size {
							t.Errorf("%s: from %q, the origin sent %d bytes; want it from the origin, once", n, fr.From, st.BytesSent)
						}
						if len(fr.MirrorErrors) == 0 || (tc.wantErr != nil && !errors.Is(fr.MirrorErrors[len(fr.MirrorErrors)-1], tc.wantErr)) {
							t.Errorf("%s: mirror errors %v, want %v", n, fr.MirrorErrors, tc.wantErr)
						}
					default:
						if st.BytesSent != 0 || fr.From != files[i].Mirrors[len(files[i].Mirrors)-1] {
							t.Errorf("%s: from %q, the origin sent %d bytes; want it all from the mirror", n, fr.From, st.BytesSent)
						}
					}
					if tc.down && len(fr.MirrorErrors) != 1 {
						t.Errorf("%s: mirror errors %v, want the down mirror's", n, fr.MirrorErrors)
					}
				}
				if took > 5*time.Second {
					t.Errorf("took %v: a failing mirror was retried with waits", took)
				}
			})
		}
	}
}

// TestMirrorNeedsAHash: a file with no sha256 or git blob id to judge a copy by takes no
// mirror.
func TestMirrorNeedsAHash(t *testing.T) {
	t.Parallel()
	s := serve(t)
	f := add(s, "a.bin", content(1000, 1))
	f.SHA256, f.Mirrors = "", []string{s.URL("/a.bin")}
	opts := testOptions(t.TempDir())
	opts.AllowUnverified = true
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts); !errors.Is(err, fetch.ErrUnverified) {
		t.Fatalf("Fetch = %v, want ErrUnverified", err)
	}
}

// downURL is the base URL of a server that has gone away: connections are refused.
func downURL(t *testing.T) string {
	s := fetchtest.NewServer()
	u := s.URL("")
	s.Close()
	return u
}

// TestMirrorDownMidFile: a mirror that stops sending halfway through a file (and then sends
// nothing) is given up, and the origin is asked only for what the mirror did not deliver:
// the bytes the mirror wrote are kept and judged by the sha256 with the rest.
func TestMirrorDownMidFile(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	for _, ranged := range []bool{true, false} {
		t.Run(fmt.Sprintf("ranged %v", ranged), func(t *testing.T) {
			t.Parallel()
			origin, mirror := serve(t), serve(t)
			data := content(size, 110)
			f := add(origin, "model.bin", data)
			mirror.Set("/model.bin", data)
			mirror.SetFault("/model.bin", fetchtest.Fault{StallAt: []int64{size / 2}})
			f.Mirrors = []string{mirror.URL("/model.bin")}
			dest := t.TempDir()
			opts := testOptions(dest)
			if ranged {
				opts = rangedOptions(dest)
			}
			opts.StallTimeout = 300 * time.Millisecond
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
			fr, st := res.Files[0], origin.Stats("/model.bin")
			t.Logf("from %s, mirror errors %v, origin stats %+v, mirror stats %+v", fr.From, fr.MirrorErrors, st, mirror.Stats("/model.bin"))
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", data)
			if fr.From != f.URL || len(fr.MirrorErrors) != 1 || !errors.Is(fr.MirrorErrors[0], fetch.ErrStalled) {
				t.Errorf("from %q, mirror errors %v: want the origin after the mirror stalled", fr.From, fr.MirrorErrors)
			}
			if st.BytesSent > size/2 || fr.OriginBytes != st.BytesSent {
				t.Errorf("the origin sent %d bytes (OriginBytes %d), want at most the %d the mirror did not", st.BytesSent, fr.OriginBytes, size/2)
			}
		})
	}
}
