package incus

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHostileDaemonBoundedByDeadline (issue 9, point 2): an Incus socket that never
// answers, answers garbage, answers slowly (a body that drips forever) or answers more
// than maxResponseBytes makes every call return an error by the client's deadline; none
// hangs and none is taken for an answer.
func TestHostileDaemonBoundedByDeadline(t *testing.T) {
	t.Parallel()
	const deadline = 300 * time.Millisecond
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
	}{
		{"never_answers", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		}, "deadline"},
		{"drips_forever", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"type":"sync","metadata":{"api_version":"1.0"`))
			for {
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(50 * time.Millisecond):
					w.Write([]byte(" "))
				}
			}
		}, "deadline"},
		{"garbage", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("\x00\xff<html>not an Incus answer"))
		}, "incus"},
		{"wrong_shape", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"sync","metadata":"a string, not a server"}`))
		}, "incus"},
		{"too_big", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"sync","metadata":"`))
			chunk := []byte(strings.Repeat("a", 1<<20))
			for range maxResponseBytes/len(chunk) + 2 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}, "incus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sock := filepath.Join(t.TempDir(), "incus.socket")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: tc.handler}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			c := New(sock).WithOperationTimeout(deadline)
			start := time.Now()
			_, err = c.Server(context.Background())
			took := time.Since(start)
			if err == nil {
				t.Fatal("a hostile answer was taken for the server's description")
			}
			if !strings.Contains(strings.ToLower(err.Error()), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if took > deadline+2*time.Second {
				t.Errorf("returned after %v; the deadline was %v", took, deadline)
			}
		})
	}
}
