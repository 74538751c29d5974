package resources

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// Rooms one can hold in mind (issue 24): no source file of the kinds is longer than
// maxFileLines, and no function longer than maxFuncLines. A table (a var of rows, such
// as servingMetrics) is data, not a function, and is not counted. A kind that grows
// past these splits by phase (bind, observe, decide, act, status: server_*.go and
// container_*.go show how), never by raising them.
const (
	maxFileLines = 700
	maxFuncLines = 120
)

func TestRoomsStaySmall(t *testing.T) {
	t.Parallel()
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files++
		if n := fset.Position(f.FileEnd).Line; n > maxFileLines {
			t.Errorf("%s has %d lines (at most %d): split it by phase", name, n, maxFileLines)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			if n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1; n > maxFuncLines {
				t.Errorf("%s: %s has %d lines (at most %d): split it by aspect", name, funcName(fd), n, maxFuncLines)
			}
		}
	}
	if files < 10 {
		t.Fatalf("read %d source files: is the test running in resources/?", files)
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
