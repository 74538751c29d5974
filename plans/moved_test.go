package plans

import (
	"strings"
	"testing"
)

// moved blocks: a valid rename is kept; every mistake is a diagnostic at its place, and
// agent { prune } is read.
func TestMovedAndPrune(t *testing.T) {
	t.Parallel()
	const file = "file \"b\" {\n  path    = \"/tmp/b\"\n  content = \"x\"\n}\n"
	p, diags := LoadSources(".", []Source{{Name: "p.hcl", Data: []byte("agent {\n  prune = true\n}\n" + file + "moved {\n  from = file.a\n  to   = file.b\n}\n")}}, Options{Schemas: testSchemas})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if len(p.Moved) != 1 || p.Moved[0].From != "file.a" || p.Moved[0].To != "file.b" || !p.Agent.Prune {
		t.Fatalf("moved %+v, prune %v", p.Moved, p.Agent.Prune)
	}
	for _, tc := range []struct{ moved, want string }{
		{"from = file.a\n  to = file.c", "no file.c block"},
		{"from = file.b\n  to = file.b", "the same address"},
		{"from = download.a\n  to = file.b", "different kinds"},
		{"from = nope.a\n  to = file.b", `no resource kind "nope"`},
		{"from = \"file.a\"\n  to = file.b", "resource address"},
	} {
		_, diags := LoadSources(".", []Source{{Name: "p.hcl", Data: []byte(file + "moved {\n  " + tc.moved + "\n}\n")}}, Options{Schemas: testSchemas})
		if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.want) {
			t.Errorf("moved { %s }: %v, want %q", tc.moved, diags, tc.want)
		}
	}
	twice := file + "file \"c\" {\n  path    = \"/tmp/c\"\n  content = \"x\"\n}\nmoved {\n  from = file.a\n  to   = file.b\n}\nmoved {\n  from = file.a\n  to   = file.c\n}\n"
	if _, diags := LoadSources(".", []Source{{Name: "p.hcl", Data: []byte(twice)}}, Options{Schemas: testSchemas}); !strings.Contains(diags.Error(), "already moved") {
		t.Errorf("twice: %v", diags)
	}
	still := file + "file \"a\" {\n  path    = \"/tmp/a\"\n  content = \"x\"\n}\nmoved {\n  from = file.a\n  to   = file.b\n}\n"
	if _, diags := LoadSources(".", []Source{{Name: "p.hcl", Data: []byte(still)}}, Options{Schemas: testSchemas}); !strings.Contains(diags.Error(), "still in the plan") {
		t.Errorf("from still in the plan: %v", diags)
	}
}
