package lifecycle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestExcerptCollapsesLinesThatDifferOnlyInTheirTimestamp(t *testing.T) {
	t.Parallel()
	const probe = `INFO:     127.0.0.1:47730 - "GET /health HTTP/1.1" 503 Service Unavailable`
	tests := []struct {
		name string
		log  []string
		n    int
		want []string
	}{
		{
			name: "readiness probes while loading",
			log: []string{
				"[2026-05-09 09:20:01] server_args=ServerArgs(model_path='/models', tp_size=2)",
				"[2026-05-09 09:20:05 TP0] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:20:06] " + probe,
				"[2026-05-09 09:20:07] " + probe,
				"[2026-05-09 09:20:08] " + probe,
			},
			n: 20,
			want: []string{
				"[2026-05-09 09:20:01] server_args=ServerArgs(model_path='/models', tp_size=2)",
				"[2026-05-09 09:20:05 TP0] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:20:08] " + probe + "  (× 3)",
			},
		},
		{
			name: "ranks stay apart, other text stays apart",
			log: []string{
				"[2026-05-09 09:20:05 TP0] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:20:05 TP1] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 60.47",
				"[2026-05-09 09:22:07 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 61.02",
			},
			n: 20,
			want: []string{
				"[2026-05-09 09:20:05 TP0] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:20:05 TP1] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:22:05 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 60.47",
				"[2026-05-09 09:22:07 TP0] Decode batch, #running-req: 1, gen throughput (token/s): 61.02",
			},
		},
		{
			name: "identical lines without a timestamp, and a bracket that is not one",
			log: []string{
				"Traceback (most recent call last):",
				"[rank0]: RuntimeError: CUDA error: out of memory",
				"[rank0]: RuntimeError: CUDA error: out of memory",
				"[rank1]: RuntimeError: CUDA error: out of memory",
			},
			n: 20,
			want: []string{
				"Traceback (most recent call last):",
				"[rank0]: RuntimeError: CUDA error: out of memory  (× 2)",
				"[rank1]: RuntimeError: CUDA error: out of memory",
			},
		},
		{
			name: "n counts collapsed lines",
			log: []string{
				"[2026-05-09 09:20:05 TP0] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:20:06] " + probe,
				"[2026-05-09 09:20:07] " + probe,
				"[2026-05-09 09:20:07.250] " + probe,
			},
			n: 2,
			want: []string{
				"[2026-05-09 09:20:05 TP0] Load weight begin. avail mem=46.81 GB",
				"[2026-05-09 09:20:07.250] " + probe + "  (× 3)",
			},
		},
		{
			name: "timestamp-like but not one",
			log:  []string{"[2026-05-09 nope] x", "[2026-05-09 nope] x", "[a b] y", "[a c] y"},
			n:    20,
			want: []string{"[2026-05-09 nope] x  (× 2)", "[a b] y", "[a c] y"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "srv.1.log")
			if err := os.WriteFile(path, []byte(strings.Join(tt.log, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Excerpt(path, tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Excerpt (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := Excerpt(filepath.Join(t.TempDir(), "missing.log"), 20); !os.IsNotExist(err) {
		t.Errorf("Excerpt of a missing log: %v, want not-exist", err)
	}
}
