package plans

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Inputs lists every file a plan was loaded from: its plan files, a -var-file wherever it
// lives (hosts/kpro5.vars.hcl, the layout docs/fleet.md recommends), and what file()
// read, so that `agent run` watches them all (issue 27).
func TestInputsListEveryFileThePlanReads(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plan := write("plan/main.hcl", `
variable "content" {}
file "a" {
  path    = "/tmp/a"
  content = "${var.content}${file("../templates/a.txt")}"
}
`)
	vars := write("plan/hosts/kpro5.vars.hcl", `content = "x"`)
	tmpl := write("templates/a.txt", "y")
	p, diags := Load(filepath.Dir(plan), Options{Schemas: testSchemas, VarFiles: []string{vars}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	for _, want := range []string{plan, vars, tmpl} {
		if !slices.Contains(p.Inputs, want) {
			t.Errorf("Inputs %v lack %s", p.Inputs, want)
		}
	}

	// A var file that is gone is still an input: its return is a change to watch for.
	missing := filepath.Join(dir, "plan/hosts/gone.vars.hcl")
	p, diags = Load(filepath.Dir(plan), Options{Schemas: testSchemas, VarFiles: []string{missing}})
	if !diags.HasErrors() || p == nil || !slices.Contains(p.Inputs, missing) {
		t.Errorf("a missing var file: diags %v, inputs %v", diags, p)
	}
}

// A plan input that is not a regular file is refused at once, naming it and what it is:
// a FIFO in a var file's place used to hang the load (and `agent run`'s reload) until
// someone wrote to it (issue 27).
func TestPlanInputsAreRegularFilesOnly(t *testing.T) {
	dir := t.TempDir()
	plan := filepath.Join(dir, "plan.hcl")
	if err := os.WriteFile(plan, []byte(`variable "content" {}`+"\n"+`file "a" {
  path    = "/tmp/a"
  content = var.content
}`), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "host.vars.hcl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock.vars.hcl")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, c := range []struct{ path, kind string }{{fifo, "a named pipe (FIFO)"}, {sock, "a socket"}} {
		done := make(chan string, 1)
		go func() {
			_, diags := Load(plan, Options{Schemas: testSchemas, VarFiles: []string{c.path}})
			done <- diags.Error()
		}()
		select {
		case msg := <-done:
			if !strings.Contains(msg, c.path+" is "+c.kind) || !strings.Contains(msg, "must be regular files") {
				t.Errorf("%s: %s", c.path, msg)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("loading with %s as a var file hangs", c.path)
		}
	}
	// The same for file() and for a plan file itself.
	if _, err := readInput(fifo, MaxFileSize); !errors.Is(err, ErrNotRegular) {
		t.Errorf("readInput(FIFO) = %v", err)
	}
	if err := os.Remove(plan); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(plan, 0o644); err != nil {
		t.Fatal(err)
	}
	_, diags := Load(dir, Options{Schemas: testSchemas})
	if msg := diags.Error(); !strings.Contains(msg, plan+" is a named pipe (FIFO)") {
		t.Errorf("a FIFO plan file: %s", msg)
	}
}

// A diagnostic without a place (a var file that cannot be read) reads without hcl's
// "<nil>:" prefix (issue 27: it was in the daemon's log line).
func TestDiagnosticsLineHasNoNilPrefix(t *testing.T) {
	_, diags := Load(filepath.Join(t.TempDir(), "plan.hcl"), Options{Schemas: testSchemas})
	if got := DiagnosticsLine(diags); strings.Contains(got, "<nil>") || !strings.HasPrefix(got, "Cannot read plan; ") {
		t.Errorf("DiagnosticsLine = %q", got)
	}
}
