package plans

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestHostileSourcesAreBounded: sources built to crash the recursive parser (a stack
// overflow is fatal, not a panic) or to make the evaluator allocate gigabytes are refused
// with a diagnostic, quickly and in little memory (issue 9, point 2).
func TestHostileSourcesAreBounded(t *testing.T) {
	big := func(unit string, n int) string { return strings.Repeat(unit, n) }
	for _, tc := range []struct {
		name, src, want string
	}{
		{"brackets", "locals {\n a = " + big("[", 1<<20) + big("]", 1<<20) + "\n}\n", "Nested too deeply"},
		{"braces", "locals {\n a = " + big("{a=", 1<<18) + "1" + big("}", 1<<18) + "\n}\n", "Nested too deeply"},
		{"parens", "locals {\n a = " + big("(", 1<<20) + "1" + big(")", 1<<20) + "\n}\n", "Nested too deeply"},
		{"interpolations", "locals {\n a = " + big(`"${`, 1<<18) + "1" + big(`}"`, 1<<18) + "\n}\n", "Nested too deeply"},
		{"bangs", "locals {\n a = " + big("!", 1<<22) + "true\n}\n", "Too many unary operators"},
		{"minuses", "locals {\n a = " + big("- ", 1<<20) + "1\n}\n", "Too many unary operators"},
		{"conditionals", "locals {\n a = " + big("true ? 1 : ", 1<<18) + "1\n}\n", "Too many conditionals"},
		{"for_product", "locals {\n a = [for a in range(1024): [for b in range(1024): [for c in range(1024): 1]]]\n}\n", "For expressions nested too deeply"},
		{"format_width", "locals {\n a = format(\"%1000000000s\", \"\")\n}\n", "larger than 65536"},
		{"format_precision", "locals {\n a = format(\"%.999999999f\", 1)\n}\n", "larger than 65536"},
		{"formatlist_width", "locals {\n a = formatlist(\"%2000000000d\", [1])\n}\n", "larger than 65536"},
		{"indent", "locals {\n a = indent(1e9, \"a\\nb\")\n}\n", "at most 1024"},
		{"range", "locals {\n a = range(1e9)\n}\n", "more than 1024 values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			_, diags := LoadSources(".", []Source{{Name: "hostile.hcl", Data: []byte(tc.src)}}, Options{Schemas: testSchemas})
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if !diags.HasErrors() || !strings.Contains(diags.Error(), tc.want) {
				t.Fatalf("diagnostics %q, want one with %q", diags.Error(), tc.want)
			}
			if d := diags[0]; d.Subject == nil || d.Subject.Filename != "hostile.hcl" || d.Subject.Start.Line == 0 {
				t.Errorf("diagnostic has no place in the file: %+v", d)
			}
			if took > 5*time.Second {
				t.Errorf("took %v", took)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 512<<20 {
				t.Errorf("allocated %d MiB", alloc>>20)
			}
			if _, fd := Format("hostile.hcl", []byte(tc.src)); strings.Contains(tc.want, "deeply") || strings.Contains(tc.want, "Too many") {
				if !fd.HasErrors() {
					t.Errorf("Format accepted it")
				}
			}
		})
	}
	// A -var value is parsed too.
	src := "variable \"v\" {\n type = list(any)\n}\n"
	_, diags := LoadSources(".", []Source{{Name: "v.hcl", Data: []byte(src)}}, Options{Schemas: testSchemas, Vars: []string{"v=" + strings.Repeat("[", 1<<20)}})
	if !strings.Contains(diags.Error(), "Nested too deeply") {
		t.Errorf("-var: %v", diags.Error())
	}
}

// TestBoundsLeaveOrdinaryPlansAlone: the bounds are far from what a plan needs.
func TestBoundsLeaveOrdinaryPlansAlone(t *testing.T) {
	src := `locals {
  a = format("%05.2f %-8s|%[1]v %%", 3.14159, "x")
  b = indent(2, "a\nb")
  c = [for a in range(3) : [for b in range(2) : a * b]]
  d = true ? (false ? 1 : 2) : -(-3)
  e = <<-EOT
    ${upper("x")} %{if true}y%{endif}
  EOT
  f = formatlist("%s-%d", ["a", "b"], [1, 2])
}
`
	if _, diags := LoadSources(".", []Source{{Name: "ok.hcl", Data: []byte(src)}}, Options{Schemas: testSchemas}); diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if _, diags := LoadSources(".", []Source{{Name: "good.hcl", Data: []byte(goodPlan)}}, Options{Schemas: testSchemas}); diags.HasErrors() {
		t.Fatal(diags.Error())
	}
}

// TestStrictModes: a plan file, its directory or a -var-file that another user could
// have written is refused when the agent runs as root, naming the path and the fix.
func TestStrictModes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("StrictModes applies to root; run the suite as root to test it")
	}
	plan := "file \"x\" {\n  path = \"/tmp/x\"\n}\n"
	setup := func(t *testing.T, dirMode, fileMode os.FileMode) (dir, file string) {
		dir = filepath.Join(t.TempDir(), "plan")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		file = filepath.Join(dir, "main.hcl")
		if err := os.WriteFile(file, []byte(plan), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(file, fileMode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, dirMode); err != nil {
			t.Fatal(err)
		}
		return dir, file
	}
	for _, tc := range []struct {
		name              string
		dirMode, fileMode os.FileMode
		loadDir           bool
		want              string // "" = accepted
	}{
		{"ok_file", 0o755, 0o644, false, ""},
		{"ok_dir", 0o700, 0o600, true, ""},
		{"world_writable_file", 0o755, 0o646, false, "main.hcl has mode 0646"},
		{"group_writable_file", 0o755, 0o664, false, "main.hcl has mode 0664"},
		{"group_writable_file_in_dir_plan", 0o755, 0o664, true, "main.hcl has mode 0664"},
		{"writable_dir", 0o777, 0o644, false, "plan has mode 0777"},
		{"writable_dir_plan", 0o775, 0o644, true, "plan has mode 0775"},
		{"sticky_dir_single_file", 0o777 | os.ModeSticky, 0o644, false, ""},
		{"sticky_dir_plan", 0o777 | os.ModeSticky, 0o644, true, "plan has mode 0777"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, file := setup(t, tc.dirMode, tc.fileMode)
			path := file
			if tc.loadDir {
				path = dir
			}
			_, diags := Load(path, Options{Schemas: testSchemas})
			if tc.want == "" {
				if diags.HasErrors() {
					t.Fatalf("refused: %s", diags.Error())
				}
				return
			}
			msg := diags.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "chmod go-w ") {
				t.Fatalf("got %q, want %q and the fix chmod go-w", msg, tc.want)
			}
		})
	}
	t.Run("symlink_to_writable_file", func(t *testing.T) {
		_, file := setup(t, 0o755, 0o666)
		link := filepath.Join(t.TempDir(), "link.hcl")
		if err := os.Symlink(file, link); err != nil {
			t.Fatal(err)
		}
		if _, diags := Load(link, Options{Schemas: testSchemas}); !strings.Contains(diags.Error(), "→ "+file) {
			t.Fatalf("got %q", diags.Error())
		}
	})
	t.Run("owned_by_another_user", func(t *testing.T) {
		_, file := setup(t, 0o755, 0o644)
		if err := os.Chown(file, 65534, 65534); err != nil {
			t.Fatal(err) // this test runs as root (see above), where chown works
		}
		err := CheckOwnership(file, 0, false)
		if !errors.Is(err, ErrInsecurePlan) || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("var_file", func(t *testing.T) {
		_, file := setup(t, 0o755, 0o644)
		vf := filepath.Join(filepath.Dir(file), "x.vars.hcl")
		if err := os.WriteFile(vf, []byte("v = 1\n"), 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(vf, 0o666)
		_, diags := Load(file, Options{Schemas: testSchemas, VarFiles: []string{vf}})
		if !strings.Contains(diags.Error(), "chmod go-w "+vf) {
			t.Fatalf("got %q", diags.Error())
		}
	})
	t.Run("not_root", func(t *testing.T) {
		_, file := setup(t, 0o777, 0o666)
		if err := CheckOwnership(file, 1000, false); err != nil {
			t.Fatalf("a user's own plan: %v", err)
		}
	})
}
