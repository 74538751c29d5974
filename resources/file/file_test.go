package file

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources/restest"
)

// applyPlan loads src, applies it and returns the report; dir is the plan directory.
func applyPlan(t *testing.T, dir, src string) (*agent.Report, *agent.Engine) {
	t.Helper()
	e := restest.InDir(t, dir, src, []agent.Kind{FileKind()})
	return e.Apply(context.Background(), nil), e
}

func mustConverge(t *testing.T, e *agent.Engine) {
	t.Helper()
	rep := e.Plan(context.Background())
	if rep.Failed() || rep.Changes() {
		for _, st := range rep.Steps {
			t.Errorf("%s: %v %v", st.Addr, st.Err, st.Diff)
		}
		t.Fatal("second plan is not a no-op")
	}
}

func TestFileLifecycle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "unit.src"), []byte("[Unit]\n"), 0o644)
	rep, e := applyPlan(t, dir, `
variable "root" {}
file "nested" {
  path    = "${var.root}/a/b/c.conf"
  content = "x\n"
}
file "setuid" {
  path    = "${var.root}/tool"
  content = "#!/bin/sh\n"
  mode    = "4755"
}
file "from_source" {
  path   = "${var.root}/unit.service"
  source = "unit.src"
  owner  = "0"
  group  = "0"
}
`)
	if rep.Failed() {
		for _, st := range rep.Steps {
			t.Log(st.Addr, st.Err)
		}
		t.Fatal("apply failed")
	}
	mustConverge(t, e)
	st, _ := os.Stat(filepath.Join(dir, "tool"))
	if st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o755 {
		t.Errorf("mode = %v, want setuid 0755", st.Mode())
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "unit.service")); string(got) != "[Unit]\n" {
		t.Errorf("content from source = %q", got)
	}
}

func TestFileModeOnlyChangeKeepsInode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("same\n"), 0o600)
	before, _ := os.Stat(path)
	rep, e := applyPlan(t, dir, "variable \"root\" {}\nfile \"f\" {\n  path = \"${var.root}/f\"\n  content = \"same\\n\"\n  mode = \"0640\"\n}\n")
	if rep.Failed() || rep.Steps[0].Diff.Action != agent.Update {
		t.Fatalf("apply: %v %v", rep.Steps[0].Err, rep.Steps[0].Diff)
	}
	if len(rep.Steps[0].Diff.Changes) != 1 || rep.Steps[0].Diff.Changes[0].Attr != "mode" {
		t.Errorf("changes = %+v, want mode only", rep.Steps[0].Diff.Changes)
	}
	after, _ := os.Stat(path)
	if !os.SameFile(before, after) || after.Mode().Perm() != 0o640 {
		t.Errorf("mode change rewrote the file or missed: same=%v mode=%v", os.SameFile(before, after), after.Mode())
	}
	mustConverge(t, e)
}

func TestFileUnsetModeIsNotManaged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	os.WriteFile(path, []byte("old\n"), 0o600)
	rep, e := applyPlan(t, dir, "variable \"root\" {}\nfile \"f\" {\n  path = \"${var.root}/f\"\n  content = \"new\\n\"\n}\n")
	if rep.Failed() {
		t.Fatal(rep.Steps[0].Err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("rewrite changed an unmanaged mode to %v", st.Mode().Perm())
	}
	mustConverge(t, e)
}

func TestFileAbsent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "gone")
	os.WriteFile(path, []byte("x"), 0o644)
	rep, e := applyPlan(t, dir, "variable \"root\" {}\nfile \"g\" {\n  path = \"${var.root}/gone\"\n  ensure = \"absent\"\n}\n")
	if rep.Failed() || rep.Steps[0].Diff.Action != agent.Delete {
		t.Fatalf("apply: %v", rep.Steps[0].Err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("file still there: %v", err)
	}
	mustConverge(t, e)
}

func TestFileRefusesSymlinkAndDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	elsewhere := filepath.Join(dir, "elsewhere")
	os.WriteFile(elsewhere, []byte("precious\n"), 0o644)
	os.Symlink(elsewhere, filepath.Join(dir, "link"))
	os.Mkdir(filepath.Join(dir, "adir"), 0o755)
	rep, _ := applyPlan(t, dir, `
variable "root" {}
file "link" {
  path    = "${var.root}/link"
  content = "overwrite\n"
}
file "dir" {
  path    = "${var.root}/adir"
  content = "x"
}
`)
	for _, st := range rep.Steps {
		if st.Err == nil {
			t.Errorf("%s: applied over a non-regular file", st.Addr)
		}
	}
	if got, _ := os.ReadFile(elsewhere); string(got) != "precious\n" {
		t.Errorf("the symlink target was written: %q", got)
	}
	if !strings.Contains(rep.Steps[0].Err.Error(), "is a symlink to "+elsewhere) {
		t.Errorf("error = %v", rep.Steps[0].Err)
	}
}

func TestFileBindErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ body, want string }{
		{`path = "rel"
content = "x"`, "Relative file path"},
		{`path = "/a/../b"
content = "x"`, "Unclean file path"},
		{`path = "/a"`, "No content"},
		{`path = "/a"
content = "x"
source = "y"`, "Both content and source"},
		{`path = "/a"
ensure = "gone"`, "Invalid ensure"},
		{`path = "/a"
ensure = "absent"
content = "x"`, "Content for an absent file"},
		{`path = "/a"
content = "x"
mode = "0999"`, "Invalid mode"},
	}
	for _, tt := range tests {
		src := "file \"a\" {\n" + tt.body + "\n}\n"
		_, diags := restest.BindPlan(src, []agent.Kind{FileKind()})
		if !diags.HasErrors() || diags[0].Summary != tt.want || diags[0].Subject == nil {
			t.Errorf("Bind(%q) = %v, want %q with a source range", tt.body, diags, tt.want)
		}
	}
}

// TestFileCheckWritesNothing: the file's Check writes nothing (issue 24; see
// restest.CheckWritesNothing).
func TestFileCheckWritesNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := restest.OpenStore(t, filepath.Join(dir, ".state"))
	src := "variable \"root\" {}\nfile \"f\" {\n  path    = \"${var.root}/f.conf\"\n  content = \"x\\n\"\n}\n"
	if d := restest.CheckWritesNothing(t, dir, src, []agent.Kind{FileKind()}, store, "file.f", "root="+dir); d.Action != agent.Create {
		t.Errorf("diff %+v, want a create", d)
	}
}
