package incus

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// fakeIncus is an httptest server on a unix socket that answers like Incus.
// Tests register handlers on mux and read what the client sent from calls.
type fakeIncus struct {
	mux    *http.ServeMux
	client *Client

	mu    sync.Mutex
	calls []string // "METHOD /path?query", in order
}

func newFake(t *testing.T) *fakeIncus {
	t.Helper()
	dir := t.TempDir()
	if len(dir) > 90 { // unix socket paths are limited to about 108 bytes
		var err error
		if dir, err = os.MkdirTemp("", "ifk"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	sock := filepath.Join(dir, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeIncus{mux: http.NewServeMux()}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		call := r.Method + " " + r.URL.Path
		if r.URL.RawQuery != "" {
			call += "?" + r.URL.RawQuery
		}
		f.calls = append(f.calls, call)
		f.mu.Unlock()
		f.mux.ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	f.client = New(sock)
	return f
}

func (f *fakeIncus) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeSync(w http.ResponseWriter, metadata any) {
	writeJSON(w, http.StatusOK, map[string]any{
		"type": "sync", "status": "Success", "status_code": 200, "metadata": metadata,
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"type": "error", "error": msg, "error_code": status})
}

func writeAsync(w http.ResponseWriter, id string, metadata map[string]any) {
	w.Header().Set("Location", "/1.0/operations/"+id)
	writeJSON(w, http.StatusAccepted, map[string]any{
		"type": "async", "status": "Operation created", "status_code": 100,
		"operation": "/1.0/operations/" + id,
		"metadata":  opJSON(id, 103, "", metadata),
	})
}

// opJSON is an operation as Incus renders it.
func opJSON(id string, code int, errText string, metadata map[string]any) map[string]any {
	status := map[int]string{100: "Operation created", 103: "Running", 200: "Success", 400: "Failure", 401: "Cancelled"}[code]
	return map[string]any{
		"id": id, "class": "task", "description": "Test operation",
		"status": status, "status_code": code, "metadata": metadata,
		"may_cancel": false, "err": errText,
	}
}

// finishOp registers a wait endpoint for id that answers success with the
// given metadata.
func (f *fakeIncus) finishOp(id string, metadata map[string]any) {
	f.mux.HandleFunc("GET /1.0/operations/"+id+"/wait", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, opJSON(id, 200, "", metadata))
	})
}
