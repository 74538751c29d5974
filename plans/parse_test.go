package plans

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// chunkCases are plans whose lines starting with a letter fall where a cut would change
// the meaning: inside heredocs, comments, multi-line lists and blocks.
var chunkCases = map[string]string{
	"heredoc":          "file \"a\" {\n  content = <<EOT\nfile \"b\" {\nEOT\n  mode = \"0644\"\n}\nfile \"c\" {\n  path = \"/c\"\n}\n",
	"indented heredoc": "file \"a\" {\n  content = <<-EOT\n    x\nEOT\n}\nlocals {\n  y = 1\n}\n",
	"comment":          "/* a comment\nfile \"x\" {\n}\n*/\nfile \"a\" {\n  path = \"/a\"\n}\n",
	"list":             "locals {\n  l = [\na,\nb]\n}\nfile \"a\" {\n  path = \"/a\"\n}\n",
	"nested":           "container \"c\" {\n  disk \"d\" {\nsource = \"/x\"\n  }\n}\nserver \"s\" {\n  port = 1\n}\n",
	"template":         "file \"a\" {\n  content = \"${\nvar.x}\"\n}\nfile \"b\" {\n}\n",
	"no final newline": "file \"a\" {\n  path = \"/a\"\n}\nfile \"b\" {\n  path = \"/b\"\n}",
	"crlf":             "file \"a\" {\r\n  path = \"/a\"\r\n}\r\nfile \"b\" {\r\n  path = \"/b\"\r\n}\r\n",
	"unicode":          "file \"ä\" {\n  content = \"日本語 é\"\n}\nfile \"b\" {\n  path = \"/b\"\n}\n",
	"attribute twice":  "a = 1\nfile \"x\" {\n}\na = 2\n",
	"error":            "file \"a\" {\n  path = \n}\nfile \"b\" {\n}\n",
}

// checkChunked parses src whole and in chunks of every size up to its length: a
// chunked parse either gives up (nil: the caller parses whole) or equals the whole
// parse, ranges included.
func checkChunked(t *testing.T, src []byte) {
	t.Helper()
	whole, diags := hclsyntax.ParseConfig(src, "p.hcl", hcl.InitialPos)
	for size := 1; size <= len(src)+1; size++ {
		f := parseChunks(src, "p.hcl", size)
		if f == nil {
			continue
		}
		if diags.HasErrors() {
			t.Fatalf("chunks of %d bytes parsed cleanly, the whole file has errors: %s", size, diags)
		}
		if !reflect.DeepEqual(f.Body, whole.Body) {
			t.Fatalf("chunks of %d bytes parse to another body than the whole file:\n%s", size, src)
		}
		if string(f.Bytes) != string(src) {
			t.Fatalf("chunks of %d bytes: the file's bytes are not the source", size)
		}
	}
}

func TestParseChunksEqualsTheWholeFile(t *testing.T) {
	for name, src := range chunkCases {
		t.Run(name, func(t *testing.T) { checkChunked(t, []byte(src)) })
	}
	t.Run("many resources", func(t *testing.T) {
		src := manyResources(300)
		whole, _ := hclsyntax.ParseConfig(src, "p.hcl", hcl.InitialPos)
		f := parseChunks(src, "p.hcl", 512)
		if f == nil || !reflect.DeepEqual(f.Body, whole.Body) {
			t.Fatal("a plan of 300 resources in 512-byte chunks does not parse to the whole file's body")
		}
		if n := len(f.Body.(*hclsyntax.Body).Blocks); n != 302 {
			t.Fatalf("%d blocks, want 302", n)
		}
	})
	// Every plan shipped with the project.
	files, _ := filepath.Glob("../examples/*/*.hcl")
	more, _ := filepath.Glob("../packaging/*.hcl")
	for _, path := range append(files, more...) {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(path, func(t *testing.T) {
			whole, _ := hclsyntax.ParseConfig(src, "p.hcl", hcl.InitialPos)
			for _, size := range []int{1, 64, 1024} {
				if f := parseChunks(src, "p.hcl", size); f != nil && !reflect.DeepEqual(f.Body, whole.Body) {
					t.Fatalf("chunks of %d bytes parse to another body than the whole file", size)
				}
			}
		})
	}
}

// TestParseFileDiagnosticsAreTheWholeFiles: an error in a large file is reported as the
// whole-file parse reports it (same ranges), never from a chunk's view.
func TestParseFileDiagnosticsAreTheWholeFiles(t *testing.T) {
	src := string(manyResources(2000)) + "file \"bad\" {\n  path = \n}\n"
	_, want := hclsyntax.ParseConfig([]byte(src), "p.hcl", hcl.InitialPos)
	_, got := parseFile([]byte(src), "p.hcl")
	if !want.HasErrors() || got.Error() != want.Error() {
		t.Fatalf("diagnostics %q, want the whole file's %q", got.Error(), want.Error())
	}
	if !strings.Contains(got.Error(), "p.hcl:") {
		t.Fatalf("diagnostics %q name no position", got.Error())
	}
}

// FuzzParseChunks: for any input, a chunked parse that succeeds equals the whole parse.
func FuzzParseChunks(f *testing.F) {
	for _, src := range chunkCases {
		f.Add([]byte(src), uint8(7))
	}
	f.Fuzz(func(t *testing.T, src []byte, size uint8) {
		if len(src) > 4096 {
			return
		}
		whole, diags := hclsyntax.ParseConfig(src, "p.hcl", hcl.InitialPos)
		c := parseChunks(src, "p.hcl", int(size)+1)
		if c == nil {
			return
		}
		if diags.HasErrors() {
			t.Fatalf("chunks parsed cleanly, the whole file has errors: %s", diags)
		}
		if !reflect.DeepEqual(c.Body, whole.Body) {
			t.Fatalf("chunks of %d bytes parse to another body than the whole file", int(size)+1)
		}
	})
}
