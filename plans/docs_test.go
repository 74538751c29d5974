package plans

import (
	"os"
	"regexp"
	"sort"
	"testing"
)

// TestFunctionsDocumented keeps docs/plan-language.md's function list equal to the
// functions a plan can call.
func TestFunctionsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/plan-language.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range FunctionNames() {
		if !regexp.MustCompile(`\b` + name + `\b`).Match(doc) {
			t.Errorf("function %s is not in docs/plan-language.md", name)
		}
	}
	names := FunctionNames()
	sort.Strings(names)
	if len(names) < 50 {
		t.Errorf("only %d functions", len(names))
	}
}
