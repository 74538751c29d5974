package testbin

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
)

// QuickstartWeightsSize is the size of the quickstart's placeholder weights (zeros), as
// examples/quickstart/quickstart.hcl pins them.
const QuickstartWeightsSize = 16 << 20

// Origin is a loopback server of a model directory, counting the body bytes it sent.
type Origin struct {
	URL  string
	sent atomic.Int64
}

// Sent is the body bytes the origin has sent so far.
func (o *Origin) Sent() int64 { return o.sent.Load() }

// QuickstartModel serves the quickstart's model directory on a loopback server until the
// test ends: examples/quickstart/model plus its placeholder weights, made here as
// examples/quickstart/model.sh makes them. Its URL is the plan's var.model_url.
func QuickstartModel(tb testing.TB) *Origin {
	tb.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		tb.Fatal("testbin: cannot find its own source")
	}
	src := filepath.Join(filepath.Dir(self), "..", "..", "examples", "quickstart", "model")
	dir := tb.TempDir()
	for _, name := range []string{"config.json", "tokenizer.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			tb.Fatalf("testbin: the quickstart's model: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), make([]byte, QuickstartWeightsSize), 0o644); err != nil {
		tb.Fatal(err)
	}
	o := &Origin{}
	files := http.FileServer(http.Dir(dir))
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		files.ServeHTTP(countingWriter{w, &o.sent}, r)
	}))
	tb.Cleanup(hs.Close)
	o.URL = hs.URL
	return o
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n.Add(int64(n))
	return n, err
}
