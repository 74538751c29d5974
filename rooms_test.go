package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Rooms one can hold in mind (issues 24 and 36): no source file of the program is longer
// than maxFileLines, and no function longer than maxFuncLines, tests and generated files
// aside. A table (a var of rows, such as servingMetrics) is data, not a function, and is
// not counted. A file that grows past these splits by what it holds (resources/server/
// shows a kind split by phase), and a function by aspect, never by raising them.
const (
	maxFileLines = 700
	maxFuncLines = 120
)

func TestRoomsStaySmall(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		files++
		if n := fset.Position(f.FileEnd).Line; n > maxFileLines {
			t.Errorf("%s has %d lines (at most %d): split it by what it holds", p, n, maxFileLines)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s has %d lines (at most %d): split it by aspect", p, funcName(fd), n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d source files: is the test running at the repository's root?", files)
	}
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// One room per kind (issue 36): a kind's package (resources/<kind>/) imports no other
// kind's, and resources/ itself, what they all share, imports none; only the registry
// (which wires them) and the kinds' tests may. A kind asks another through the
// interfaces of resources/peers.go.
func TestNoKindImportsAnother(t *testing.T) {
	t.Parallel()
	const module = "github.com/agent-dev/agent/"
	ents, err := os.ReadDir("resources")
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() && e.Name() != "registry" && e.Name() != "restest" {
			kinds[module+"resources/"+e.Name()] = true
		}
	}
	if len(kinds) < 5 {
		t.Fatalf("found kinds %v under resources/: is the test running at the repository's root?", kinds)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, dir := range append([]string{"resources"}, slices.Sorted(maps.Keys(kinds))...) {
		dir = strings.TrimPrefix(dir, module)
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range files {
			if strings.HasSuffix(p, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			for _, imp := range f.Imports {
				path := strings.Trim(imp.Path.Value, `"`)
				if kinds[path] && path != module+dir {
					t.Errorf("%s imports the kind %s: ask it through an interface of resources/peers.go (the registry wires them)", p, path)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d files", checked)
	}
}
