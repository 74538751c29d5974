package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scripts/gen-sglang-flags.py reads both layouts SGLang has used for its
// parser: add_argument calls (until 2026) and annotated dataclass fields.
func TestGeneratorReadsBothLayouts(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 (Debian's, on every machine of this project) is needed to run the generator: %v", err)
	}
	script := filepath.Join("..", "..", "scripts", "gen-sglang-flags.py")
	out, err := exec.Command(py, script, filepath.Join("testdata", "server_args_shapes.py"), "--label", "fixture").CombinedOutput()
	// The fixture has 12 flags, under the 50 a real server_args.py has: the
	// script must refuse it rather than write a short table.
	if err == nil || !strings.Contains(string(out), "only 12 flags found") {
		t.Fatalf("short input: err %v, output:\n%s", err, out)
	}
	out, err = exec.Command(py, "-c", `
import importlib.util, sys
spec = importlib.util.spec_from_file_location("gen", sys.argv[1])
gen = importlib.util.module_from_spec(spec); spec.loader.exec_module(gen)
import ast
tree = ast.parse(open(sys.argv[2]).read())
names = gen.module_literals(tree); defaults = gen.class_defaults(tree)
specs = [gen.spec_from_call(n, names, defaults) for n in ast.walk(tree)
         if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"]
specs += gen.annotated_specs(tree, names)
print("prog", gen.parser_prog(tree))
for s in specs:
    print(" ".join(s["names"]), s["typ"], s["nargs"] or "-", ",".join(s["choices"] or []) or "-", s["required"], s["default"])
`, script, filepath.Join("testdata", "server_args_shapes.py")).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{
		"prog sglang serve",
		"--model-path --model typeStr - - True None",
		"--tensor-parallel-size --tp-size typeInt - - False 1",
		"--mode typeStr - auto,slow False auto",
		"--labels typeJSON - - False None",
		"--old-flag typeBool - - False None",
		"--thing typeBoolOpt - - False None",
		"--cuda-graph-bs typeInt + - False None",
		"--level typeInt - 0,1,2,3 False 2",
		"--sizes typeInt + - False None",
		"--fast typeBool - - False False",
		"--ratio --r typeFloat - - False 0.5",
		"--max-limit typeHumanInt - - False 1k",
	} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "--hidden") {
		t.Errorf("no_cli field generated:\n%s", got)
	}
}
