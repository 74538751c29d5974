package plans

import (
	"testing"
)

// FuzzLoad feeds arbitrary source to the plan loader: it must return diagnostics, never
// panic or hang, whatever the bytes. `go test -fuzz=FuzzLoad ./plans` runs it for real;
// the suite runs the seed corpus (testdata/fuzz/FuzzLoad) and these seeds.
func FuzzLoad(f *testing.F) {
	f.Add(goodPlan)
	f.Add("file \"x\" {\n  path = \n}\n")
	f.Add("variable \"v\" {\n  type = list(object({a = string}))\n  default = [{a = 1}]\n}\n")
	f.Add("locals {\n  a = local.b\n  b = local.a\n}\n")
	f.Add("server \"s\" {\n  command = [for x in [1,2]: tostring(x)]\n  flags = { a = true }\n  depends_on = [\"file.x\"]\n}\n")
	f.Add("agent {\n interval = \"1h\"\n}\nhost {\n hostname = 1\n}\n")
	f.Fuzz(func(t *testing.T, src string) {
		p, diags := LoadSources(".", []Source{{Name: "fuzz.hcl", Data: []byte(src)}}, Options{Schemas: testSchemas})
		if !diags.HasErrors() {
			for _, r := range p.Resources {
				if r.Config == nil {
					t.Fatalf("%s has no config but no error was reported", r.Addr)
				}
			}
		}
		// Formatting must never panic, and its output must parse again.
		if out, fd := Format("fuzz.hcl", []byte(src)); !fd.HasErrors() {
			if _, fd2 := Format("fuzz.hcl", out); fd2.HasErrors() {
				t.Fatalf("formatted output does not parse: %s\n%s", fd2.Error(), out)
			}
		}
	})
}
