package download

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// pageTransport answers the first request with body and link, every later one (a next
// page) with an empty listing: the fuzzer drives one page and the Link header.
type pageTransport struct {
	body  []byte
	link  string
	calls int
}

func (p *pageTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	p.calls++
	body, h := []byte("[]"), http.Header{}
	if p.calls == 1 {
		body = p.body
		if p.link != "" {
			h.Set("Link", p.link)
		}
	}
	return &http.Response{StatusCode: http.StatusOK, Header: h, Body: io.NopCloser(bytes.NewReader(body)), Request: req}, nil
}

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// FuzzHubList feeds arbitrary tree listings (and Link headers) to the Hub tree parser
// (hubClient.list) and arbitrary include patterns to compileGlobs. Whatever the Hub
// answers, the listing is an error or a set of files that are each a clean relative path,
// listed once, with a non-negative size and a sha256 that is one: nothing a listing says
// may name a place outside dest. `go test -fuzz=FuzzHubList ./resources` runs it for
// real; the suite runs testdata/fuzz/FuzzHubList and these seeds.
func FuzzHubList(f *testing.F) {
	f.Add([]byte(`[{"type":"file","path":"config.json","size":12,"oid":"0123"},{"type":"file","path":"model.safetensors","size":5,"oid":"ab","lfs":{"oid":"`+strings.Repeat("a", 64)+`","size":99}}]`), `</api/models/x/tree/c?cursor=2>; rel="next"`, "*.json")
	f.Add([]byte(`[{"type":"file","path":"../etc/passwd","size":1}]`), "", "*")
	f.Add([]byte(`[{"type":"file","path":"/etc/passwd","size":1}]`), "", "[!a]*")
	f.Add([]byte(`[{"type":"directory","path":"sub"},{"type":"file","path":"sub/./x","size":1}]`), "", "sub/")
	f.Add([]byte(`[{"type":"file","path":"a","size":-1}]`), `<http://[::1]:x>; rel=next`, "[")
	f.Add([]byte(`[{"type":"file","path":"a","lfs":{"oid":"zz","size":1}}]`), "", `\`)
	f.Add([]byte(`{"not":"a list"}`), "", "")
	f.Fuzz(func(t *testing.T, body []byte, link, pattern string) {
		rt := &pageTransport{body: body, link: link}
		u, _ := url.Parse("http://127.0.0.1:1")
		h := &hubClient{endpoint: u, client: &http.Client{Transport: rt, Timeout: 5 * time.Second}}
		files, err := h.list(context.Background(), "org/repo", strings.Repeat("c", 40))
		if rt.calls > 2 {
			t.Fatalf("%d requests for one page and an empty next one", rt.calls)
		}
		if err == nil {
			seen := map[string]bool{}
			for _, f := range files {
				if hubSafePath(f.Path) != nil || strings.HasPrefix(f.Path, "/") || strings.Contains("/"+f.Path+"/", "/../") {
					t.Fatalf("unsafe path %q listed", f.Path)
				}
				if seen[f.Path] {
					t.Fatalf("%q listed twice", f.Path)
				}
				seen[f.Path] = true
				if f.Size < 0 {
					t.Fatalf("%q: negative size %d", f.Path, f.Size)
				}
				if f.SHA256 != "" && !sha256RE.MatchString(f.SHA256) {
					t.Fatalf("%q: sha256 %q", f.Path, f.SHA256)
				}
			}
		}
		if g, err := compileGlobs([]string{pattern}); err == nil {
			g.match("model-00001-of-00002.safetensors")
			g.match(pattern)
		}
	})
}

// TestHubHostileServerBoundedByDeadline (issue 9, point 2): a Hub that never answers,
// drips its answer forever or answers garbage makes resolve and list return an error by
// the client's deadline (hubRequestTimeout, shortened here), never a listing.
func TestHubHostileServerBoundedByDeadline(t *testing.T) {
	t.Parallel()
	const deadline = 300 * time.Millisecond
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"never_answers", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}},
		{"drips_forever", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`[{"type":"file","path":"a","size":1}`))
			for {
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(50 * time.Millisecond):
					w.Write([]byte(" "))
				}
			}
		}},
		{"garbage", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("\x00\xff<html>not the Hub"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tc.handler)
			t.Cleanup(srv.Close)
			h, err := newHubClient(srv.URL, "hf_secret", false)
			if err != nil {
				t.Fatal(err)
			}
			h.client.Timeout = deadline
			for what, call := range map[string]func() error{
				"resolve": func() error { _, err := h.resolve(context.Background(), "org/m", "main"); return err },
				"list":    func() error { _, err := h.list(context.Background(), "org/m", strings.Repeat("c", 40)); return err },
			} {
				start := time.Now()
				err := call()
				if took := time.Since(start); took > deadline+2*time.Second {
					t.Errorf("%s returned after %v; the deadline was %v", what, took, deadline)
				}
				if err == nil {
					t.Errorf("%s: a hostile answer was accepted", what)
				} else if strings.Contains(err.Error(), "hf_secret") {
					t.Errorf("%s: the error quotes the token: %v", what, err)
				}
			}
		})
	}
}
