package plans

import (
	"fmt"
	"strings"
	"testing"
)

// manyResources is a plan of n file resources, each reading a variable and a local, and
// each after the first referring to its predecessor and listing it in depends_on: the two
// shapes that made loading quadratic (every resource's context held every resource, and a
// depends_on chain nested every resource's value in the next one's).
func manyResources(n int) []byte {
	var b strings.Builder
	b.WriteString("variable \"root\" {\n  default = \"/srv\"\n}\nlocals {\n  mode = \"0644\"\n}\n")
	for i := range n {
		fmt.Fprintf(&b, "file \"f%d\" {\n  path = \"${var.root}/f%d\"\n  mode = local.mode\n", i, i)
		if i > 0 {
			fmt.Fprintf(&b, "  content = file.f%d.path\n  depends_on = [file.f%d]\n", i-1, i-1)
		}
		b.WriteString("}\n")
	}
	return []byte(b.String())
}

// BenchmarkLoad shows that loading is linear in the number of resources: ns/op per
// resource stays flat from 1,000 to 8,000 (go test -bench Load -run '^$' ./plans).
func BenchmarkLoad(b *testing.B) {
	for _, n := range []int{1000, 2000, 8000} {
		src := manyResources(n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				_, diags := LoadSources(".", []Source{{Name: "plan.hcl", Data: src}}, Options{Schemas: testSchemas})
				if diags.HasErrors() {
					b.Fatal(diags)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/resource")
		})
	}
}

// TestManyResourcesResolve checks what the benchmark's plan loads to: each resource sees
// the variable, the local and its predecessor, so the narrowed contexts lose nothing.
func TestManyResourcesResolve(t *testing.T) {
	p, diags := LoadSources(".", []Source{{Name: "plan.hcl", Data: manyResources(50)}}, Options{Schemas: testSchemas})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	byAddr := map[string]*Resource{}
	for _, r := range p.Resources {
		byAddr[r.Addr] = r
	}
	f := byAddr["file.f49"].Config.(*testFile)
	if f.Path != "/srv/f49" || deref(f.Mode) != "0644" || deref(f.Content) != "/srv/f48" {
		t.Fatalf("file.f49 decoded to path %q mode %q content %q", f.Path, deref(f.Mode), deref(f.Content))
	}
	if v := byAddr["file.f49"].Value; v.Type().HasAttribute("depends_on") {
		t.Fatalf("file.f49's value carries depends_on (%s): a chain nests every value in the next", v.Type().FriendlyName())
	}
}
