package savedplan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/plans"
)

const src = `
variable "mem" { default = 0.8 }
variable "token" {
  default   = "hf_planted_secret"
  sensitive = true
}
`

func load(t *testing.T, dir, body string, vars ...string) *plans.Plan {
	t.Helper()
	path := filepath.Join(dir, "plan.hcl")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p, diags := plans.Load(path, plans.Options{Vars: vars})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	return p
}

// A saved plan's sources: -var of a sensitive variable is not kept, every value is a
// keyed digest, and a changed file or variable is named.
func TestDescribeAndDifferences(t *testing.T) {
	dir := t.TempDir()
	key := []byte("k")
	vars := []string{"mem=0.9", "token=hf_other_secret"}
	p := load(t, dir, src, vars...)
	s, err := Describe(p, dir, nil, vars, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Vars) != 1 || s.Vars[0] != "mem=0.9" {
		t.Errorf("kept vars %v, want only the one not sensitive", s.Vars)
	}
	for _, v := range append(append([]string{}, s.Inputs[filepath.Join(dir, "plan.hcl")]), s.Variables["token"], s.Variables["mem"]) {
		if !strings.HasPrefix(v, "hmac-sha256:") {
			t.Errorf("%q is not a keyed digest", v)
		}
	}
	if d := s.Differences(s); len(d) != 0 {
		t.Errorf("the same sources differ: %v", d)
	}
	now, err := Describe(load(t, dir, src+"\n# edited\n", "mem=0.9", "token=hf_third"), dir, nil, nil, key)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(s.Differences(now), "; ")
	if !strings.Contains(got, "plan.hcl changed") || !strings.Contains(got, "variable token has another value") || strings.Contains(got, "variable mem") {
		t.Errorf("differences: %s", got)
	}
}

// Write is 0600 and Read reads it back; another format version is refused with the fix;
// Sniff tells a saved plan from a plan file.
func TestWriteReadVersions(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "x.plan")
	f := &File{Format: Format, Version: Version, ID: strings.Repeat("a", 32), Document: []byte(`{"command":"plan"}`)}
	if err := Write(path, f); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v, want 0600", st, err)
	}
	if got, err := Read(path); err != nil || got.ID != f.ID {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if !Sniff(path) {
		t.Error("Sniff does not know a saved plan")
	}
	hcl := filepath.Join(dir, "plan.hcl")
	os.WriteFile(hcl, []byte(src), 0o600)
	if Sniff(hcl) || Sniff(dir) {
		t.Error("Sniff takes a plan for a saved plan")
	}
	f.Version = Version + 1
	Write(path, f)
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), "format version 2, and this agent reads version 1") {
		t.Errorf("a newer version: %v", err)
	}
	if _, err := Read(hcl); err == nil || !strings.Contains(err.Error(), "is not a saved plan") {
		t.Errorf("a plan file: %v", err)
	}
}
