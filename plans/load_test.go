package plans

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// Test kinds: small stand-ins with the shapes real kinds use (optional attributes, maps of
// mixed values, nested blocks), so this package is tested without the resources package.
type testFile struct {
	Path    string  `hcl:"path"`
	Content *string `hcl:"content,optional"`
	Mode    *string `hcl:"mode,optional"`
}

type testDownload struct {
	Dest string `hcl:"dest"`
}

type testDisk struct {
	Name   string `hcl:"name,label"`
	Source string `hcl:"source"`
	Path   string `hcl:"path"`
}

type testContainer struct {
	Image string     `hcl:"image"`
	Disks []testDisk `hcl:"disk,block"`
}

type testServer struct {
	Container *string           `hcl:"container,optional"`
	Command   []string          `hcl:"command"`
	Flags     cty.Value         `hcl:"flags,optional"`
	Env       map[string]string `hcl:"env,optional"`
}

var testSchemas = map[string]func() any{
	"file":      func() any { return &testFile{} },
	"download":  func() any { return &testDownload{} },
	"container": func() any { return &testContainer{} },
	"server":    func() any { return &testServer{} },
}

func load(t *testing.T, src string, opts Options) (*Plan, hcl.Diagnostics) {
	t.Helper()
	opts.Schemas = testSchemas
	return LoadSources(".", []Source{{Name: "plan.hcl", Data: []byte(src)}}, opts)
}

const goodPlan = `
agent {
  state_dir = "/var/lib/agent"
  interval  = "30s"
}

host {
  hostname = "kpro5"
}

variable "model_root" {
  default = "/srv/models"
}

variable "tp" {
  type    = number
  default = 2
  validation {
    condition     = var.tp >= 1
    error_message = "tp must be at least 1."
  }
}

locals {
  model_dir = "${var.model_root}/Qwen3.6-27B"
}

download "qwen" {
  dest = local.model_dir
}

container "sglang" {
  image = "ubuntu-24.04"
  disk "models" {
    source = download.qwen.dest
    path   = "/models"
  }
}

server "qwen" {
  container = container.sglang.name
  command   = ["python3", "-m", "sglang.launch_server"]
  flags = {
    "model-path"     = "/models"
    "tp-size"        = var.tp
    "enable-metrics" = true
  }
  env = { CUDA_VISIBLE_DEVICES = join(",", ["0", "1"]) }
}

file "nouveau" {
  path       = "/etc/modprobe.d/blacklist-nouveau.conf"
  content    = upper("blacklist nouveau\n")
  depends_on = [download.qwen]
}
`

func TestLoadGoodPlan(t *testing.T) {
	t.Parallel()
	p, diags := load(t, goodPlan, Options{})
	if diags.HasErrors() {
		var b bytes.Buffer
		WriteDiagnostics(&b, p.Files, diags)
		t.Fatalf("unexpected diagnostics:\n%s", b.String())
	}
	if p.Agent.StateDir != "/var/lib/agent" || p.Agent.Interval.String() != "30s" || p.Host.Hostname != "kpro5" {
		t.Errorf("agent/host = %+v %+v", p.Agent, p.Host)
	}
	var addrs []string
	deps := map[string][]string{}
	for _, r := range p.Resources {
		addrs = append(addrs, r.Addr)
		deps[r.Addr] = r.DependsOn
	}
	if diff := cmp.Diff([]string{"download.qwen", "container.sglang", "server.qwen", "file.nouveau"}, addrs); diff != "" {
		t.Errorf("resources (-want +got):\n%s", diff)
	}
	wantDeps := map[string][]string{
		"download.qwen":    nil,
		"container.sglang": {"download.qwen"},
		"server.qwen":      {"container.sglang"},
		"file.nouveau":     {"download.qwen"},
	}
	if diff := cmp.Diff(wantDeps, deps); diff != "" {
		t.Errorf("dependencies (-want +got):\n%s", diff)
	}
	c := p.Resource("container.sglang").Config.(*testContainer)
	if c.Disks[0].Source != "/srv/models/Qwen3.6-27B" {
		t.Errorf("disk source = %q, want the download's dest", c.Disks[0].Source)
	}
	s := p.Resource("server.qwen").Config.(*testServer)
	if *s.Container != "sglang" {
		t.Errorf("container = %q, want the container's name (its label)", *s.Container)
	}
	if tp := s.Flags.GetAttr("tp-size"); !tp.RawEquals(cty.NumberIntVal(2)) {
		t.Errorf("flags[tp-size] = %#v", tp)
	}
	if s.Env["CUDA_VISIBLE_DEVICES"] != "0,1" {
		t.Errorf("env = %v", s.Env)
	}
	if got := *p.Resource("file.nouveau").Config.(*testFile).Content; got != "BLACKLIST NOUVEAU\n" {
		t.Errorf("content = %q", got)
	}
}

func TestVariablePrecedence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vf1 := filepath.Join(dir, "a.vars.hcl")
	vf2 := filepath.Join(dir, "b.vars.hcl")
	os.WriteFile(vf1, []byte("root = \"/from/file-a\"\ntp = 4\n"), 0o644)
	os.WriteFile(vf2, []byte("root = \"/from/file-b\"\n"), 0o644)
	src := `
variable "root" { default = "/default" }
variable "tp" {
  type    = number
  default = 1
}
variable "gpus" {
  type    = list(string)
  default = []
}
file "x" { path = "${var.root}/${var.tp}/${join(",", var.gpus)}" }
`
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"default", Options{}, "/default/1/"},
		{"environment", Options{Environ: []string{"AGENT_VAR_root=/env", "AGENT_VAR_gpus=[\"0\",\"1\"]", "PATH=/bin"}}, "/env/1/0,1"},
		{"var files in order beat the environment", Options{Environ: []string{"AGENT_VAR_root=/env"}, VarFiles: []string{vf1, vf2}}, "/from/file-b/4/"},
		{"-var beats var files", Options{VarFiles: []string{vf1}, Vars: []string{"root=/cli", "tp=8"}}, "/cli/8/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, diags := load(t, src, tt.opts)
			if diags.HasErrors() {
				t.Fatal(diags.Error())
			}
			if got := p.Resource("file.x").Config.(*testFile).Path; got != tt.want {
				t.Errorf("path = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSensitive(t *testing.T) {
	t.Parallel()
	src := `
variable "token" {
  sensitive = true
  default   = "hf_s3cr3t_token"
}
file "token" {
  path    = "/etc/agent/hf-token"
  content = "${var.token}\n"
}
`
	p, diags := load(t, src, Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	r := p.Resource("file.token")
	if !r.Sensitive["content"] || r.Sensitive["path"] {
		t.Errorf("Sensitive = %v, want content only", r.Sensitive)
	}
	if diff := cmp.Diff([]string{"hf_s3cr3t_token"}, p.Secrets()); diff != "" {
		t.Errorf("Secrets (-want +got):\n%s", diff)
	}
}

// A secret in one element of a map marks that element alone; a map that is a secret as a
// whole, or whose key is one, stays sensitive as a whole.
func TestSensitivePerKey(t *testing.T) {
	t.Parallel()
	src := `
variable "token" {
  sensitive = true
  default   = "hf_s3cr3t_token"
}
variable "secret_env" {
  sensitive = true
  default   = { A = "1" }
}
variable "secret_key" {
  sensitive = true
  default   = "K"
}
server "per_key" {
  command = ["/bin/true", "${var.token}"]
  flags   = { api-key = var.token, port = 30000, nested = { x = var.token } }
  env     = { HF_TOKEN = "Bearer ${var.token}", CUDA_VISIBLE_DEVICES = "0,1" }
}
server "whole" {
  command = ["/bin/true"]
  flags   = var.secret_env
}
server "key" {
  command = ["/bin/true"]
  env     = { (var.secret_key) = "v" }
}
`
	p, diags := load(t, src, Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	got := map[string]map[string]bool{}
	for _, a := range []string{"server.per_key", "server.whole", "server.key"} {
		got[a] = p.Resource(a).Sensitive
	}
	want := map[string]map[string]bool{
		"server.per_key": {"command": true, `flags["api-key"]`: true, `flags["nested"]`: true, `env["HF_TOKEN"]`: true},
		"server.whole":   {"flags": true},
		"server.key":     {"env": true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Sensitive (-want +got):\n%s", diff)
	}
	r := p.Resource("server.per_key")
	if !r.SensitiveKey("env", "HF_TOKEN") || r.SensitiveKey("env", "CUDA_VISIBLE_DEVICES") || r.SensitiveKey("flags", "port") || !r.SensitiveAny("env") || r.SensitiveAny("container") {
		t.Errorf("SensitiveKey/SensitiveAny disagree with %v", r.Sensitive)
	}
	if w := p.Resource("server.whole"); !w.SensitiveKey("flags", "A") || !w.SensitiveKey("flags", "anything") {
		t.Errorf("a sensitive map must make every key sensitive: %v", w.Sensitive)
	}
}

// TestErrors loads one broken plan per kind of error and checks the summary and the
// position every diagnostic points at.
func TestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		src  string
		opts Options
		want []string // "summary @ line:col"
	}{
		{"syntax error", "file \"x\" {\n  path = \n}\n", Options{},
			[]string{"Invalid expression @ 2:10"}},
		{"unknown block type", "sever \"qwen\" {\n}\n", Options{},
			[]string{"Unsupported block type @ 1:1"}},
		{"unknown attribute", "file \"x\" {\n  path = \"/a\"\n  colour = \"red\"\n}\n", Options{},
			[]string{"Unsupported argument @ 3:3"}},
		{"wrong type", "file \"x\" {\n  path = [\"/a\"]\n}\n", Options{},
			[]string{"Unsuitable value type @ 2:10"}},
		{"missing required attribute", "file \"x\" {\n  mode = \"0644\"\n}\n", Options{},
			[]string{"Missing required argument @ 1:10"}},
		{"unknown resource reference", "file \"x\" {\n  path = download.nope.dest\n}\n", Options{},
			[]string{"Reference to undeclared resource @ 2:10"}},
		{"unknown variable", "file \"x\" {\n  path = var.nope\n}\n", Options{},
			[]string{"Reference to undeclared input variable @ 2:10"}},
		{"unknown root", "file \"x\" {\n  path = self.path\n}\n", Options{},
			[]string{"Unknown reference @ 2:10"}},
		{"cycle", "file \"a\" {\n  path = file.b.path\n}\nfile \"b\" {\n  path = \"/b\"\n  depends_on = [file.a]\n}\n", Options{},
			[]string{"Dependency cycle @ 1:1"}},
		{"self reference", "file \"a\" {\n  path = file.a.mode\n}\n", Options{},
			[]string{"Self-reference @ 2:10"}},
		{"duplicate resource", "file \"a\" {\n  path = \"/a\"\n}\nfile \"a\" {\n  path = \"/b\"\n}\n", Options{},
			[]string{"Duplicate resource @ 4:1"}},
		{"required variable", "variable \"root\" {}\nfile \"a\" {\n  path = var.root\n}\n", Options{},
			[]string{"No value for required variable @ 1:1"}},
		{"failed validation", "variable \"tp\" {\n  type = number\n  default = 0\n  validation {\n    condition = var.tp > 0\n    error_message = \"tp must be positive.\"\n  }\n}\n", Options{},
			[]string{"Invalid value for variable @ 3:13"}},
		{"wrong variable type from -var", "variable \"tp\" {\n  type = number\n}\n", Options{Vars: []string{"tp=two"}},
			[]string{"Invalid value for variable @ 0:0"}},
		{"undeclared -var", "", Options{Vars: []string{"nope=1"}},
			[]string{"Value for undeclared variable @ 0:0"}},
		{"bad interval", "agent {\n  interval = \"soon\"\n}\n", Options{},
			[]string{"Invalid interval @ 2:3"}},
		{"resource in locals", "locals {\n  a = file.x.path\n}\nfile \"x\" {\n  path = \"/x\"\n}\n", Options{},
			[]string{"Resource reference in locals @ 2:7"}},
		{"all errors at once", "file \"x\" {\n  colour = 1\n}\nserver \"s\" {\n  command = \"python3\"\n  flags = var.nope\n}\n", Options{},
			[]string{"Missing required argument @ 1:10", "Unsupported argument @ 2:3", "Unsuitable value type @ 5:14", "Reference to undeclared input variable @ 6:11"}},
		// Issue 29 point 3: a variable without a value, or a dependency that failed,
		// hides none of the errors that do not depend on their values.
		{"errors beside missing values", "variable \"port\" { type = number }\nserver \"s\" {\n  command = [\"x\"]\n  env = { PORT = var.port }\n  logdir = \"/l\"\n  container = [\"c\"]\n}\nfile \"f\" {\n  path = \"/f\"\n  content = server.s.env.PORT\n  mode = [1]\n}\n", Options{},
			[]string{"No value for required variable @ 1:1", "Unsupported argument @ 5:3", "Unsuitable value type @ 6:15", "Unsuitable value type @ 11:10"}},
		{"var file with unknown variable", "variable \"a\" {\n  default = 1\n}\n", Options{VarFiles: []string{"testdata/unknown.vars.hcl"}},
			[]string{"Value for undeclared variable @ 1:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, diags := load(t, tt.src, tt.opts)
			var got []string
			for _, d := range diags {
				pos := "0:0"
				if d.Subject != nil {
					pos = fmt.Sprintf("%d:%d", d.Subject.Start.Line, d.Subject.Start.Column)
				}
				got = append(got, d.Summary+" @ "+pos)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("diagnostics (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWriteDiagnostics(t *testing.T) {
	t.Parallel()
	p, diags := load(t, "file \"x\" {\n  path   = \"/a\"\n  colour = \"red\"\n}\n", Options{})
	var b strings.Builder
	WriteDiagnostics(&b, p.Files, diags)
	want := `Error: Unsupported argument
  --> plan.hcl:3:3
    |
  3 |   colour = "red"
    |   ^^^^^^
An argument named "colour" is not expected here.
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
}

func TestLoadDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "vars.hcl"), []byte("variable \"root\" {\n  default = \"/r\"\n}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "files.hcl"), []byte("file \"a\" {\n  path = \"${var.root}/a\"\n}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "README.md"), []byte("not a plan"), 0o644)
	// A variable file beside the plan is read only with -var-file.
	os.WriteFile(filepath.Join(dir, "kpro5.vars.hcl"), []byte("root = \"/kpro5\"\n"), 0o644)
	p, diags := Load(dir, Options{Schemas: testSchemas})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if got := p.Resource("file.a").Config.(*testFile).Path; got != "/r/a" {
		t.Errorf("path = %q", got)
	}
	if p.Dir != dir {
		t.Errorf("Dir = %q, want %q", p.Dir, dir)
	}
	p, diags = Load(dir, Options{Schemas: testSchemas, VarFiles: []string{filepath.Join(dir, "kpro5.vars.hcl")}})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if got := p.Resource("file.a").Config.(*testFile).Path; got != "/kpro5/a" {
		t.Errorf("path with -var-file = %q", got)
	}
}

func TestFileFunctionIsRelativeToPlan(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "motd.txt"), []byte("hello\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "plan.hcl"), []byte("file \"a\" {\n  path = \"/etc/motd\"\n  content = file(\"motd.txt\")\n}\n"), 0o644)
	p, diags := Load(filepath.Join(dir, "plan.hcl"), Options{Schemas: testSchemas})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	if got := *p.Resource("file.a").Config.(*testFile).Content; got != "hello\n" {
		t.Errorf("content = %q", got)
	}
}

func TestResourceRange(t *testing.T) {
	t.Parallel()
	p, diags := load(t, goodPlan, Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	r := p.Resource("container.sglang")
	if got := r.Range("disk", "path"); got.Start.Line != 36 {
		t.Errorf("Range(disk, path) line = %d, want 36", got.Start.Line)
	}
	if got := r.Range("nope"); got != r.DeclRange {
		t.Errorf("Range of a missing attribute = %v, want the block header", got)
	}
}
