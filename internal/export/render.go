package export

import (
	"fmt"
	"math/big"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/cmdline"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources/registry"
)

// FileName is the name Render gives the plan in diagnostics.
const FileName = "export.hcl"

// Server readiness by engine: the endpoint and the log line that say the server is up.
var readiness = map[string][2]string{
	EngineSGLang:   {"/health", engines.ReadyLine(engines.SGLang)},
	EngineVLLM:     {"/health", engines.ReadyLine(engines.VLLM)},
	EngineLlamaCPP: {"/health", engines.ReadyLine(engines.LlamaCPP)},
}

// segment is one top-level block of the output, with the comment above it.
type segment struct {
	comment []string
	text    string // the block, without comment; "" for a comment-only segment
	// disabled is why the block is written commented out ("" when it is live).
	disabled []string
}

// Render writes h as a formatted plan. Each block is checked as `agent validate` would
// check it; one that does not validate is commented out with the reason, so the result
// always validates.
func Render(h *Observation) ([]byte, error) {
	segs := segments(h)
	for pass := 0; pass < 8; pass++ {
		src := join(segs, nil)
		lines := lineIndex(segs)
		diags := validate(src)
		if !diags.HasErrors() {
			out, fd := plans.Format(FileName, src)
			if fd.HasErrors() {
				return nil, fmt.Errorf("export: %s", fd.Error())
			}
			return out, nil
		}
		changed := false
		for _, d := range diags {
			if d.Severity != hcl.DiagError {
				continue
			}
			if d.Subject == nil {
				return nil, fmt.Errorf("export: the plan does not validate: %s", d.Error())
			}
			i := lines[d.Subject.Start.Line]
			if i < 0 || segs[i].text == "" {
				return nil, fmt.Errorf("export: the plan does not validate: %s", d.Error())
			}
			reason := d.Summary
			if d.Detail != "" {
				reason += ": " + d.Detail
			}
			if len(segs[i].disabled) == 0 {
				changed = true
			}
			if !containsStr(segs[i].disabled, reason) {
				segs[i].disabled = append(segs[i].disabled, reason)
			}
		}
		if !changed {
			return nil, fmt.Errorf("export: the plan does not validate: %s", diags.Error())
		}
	}
	return nil, fmt.Errorf("export: the plan does not validate after commenting out the blocks that fail")
}

func containsStr(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// validate loads and binds src as `agent validate` does.
func validate(src []byte) hcl.Diagnostics {
	kinds := registry.Kinds()
	p, diags := plans.LoadSources(".", []plans.Source{{Name: FileName, Data: src}}, plans.Options{Schemas: agent.Schemas(kinds)})
	if diags.HasErrors() {
		return diags
	}
	_, bd := agent.Bind(p, kinds)
	return append(diags, bd...)
}

// join renders the segments.
func join(segs []segment, _ []int) []byte {
	var b strings.Builder
	for i, s := range segs {
		if i > 0 {
			b.WriteString("\n")
		}
		for _, c := range s.comment {
			b.WriteString(comment(c))
		}
		if s.text == "" {
			continue
		}
		if len(s.disabled) > 0 {
			b.WriteString("# Commented out by agent export: this block does not validate:\n")
			for _, r := range s.disabled {
				b.WriteString(comment("  " + r))
			}
			for _, l := range strings.Split(strings.TrimSuffix(s.text, "\n"), "\n") {
				b.WriteString("# " + l + "\n")
			}
			continue
		}
		b.WriteString(s.text)
	}
	return []byte(b.String())
}

// lineIndex maps each line of join's output (1-based) to its segment.
func lineIndex(segs []segment) map[int]int {
	m := map[int]int{}
	line := 1
	for i, s := range segs {
		n := 0
		if i > 0 {
			n++
		}
		for _, c := range s.comment {
			n += strings.Count(comment(c), "\n")
		}
		if s.text != "" {
			if len(s.disabled) > 0 {
				n++
				for _, r := range s.disabled {
					n += strings.Count(comment("  "+r), "\n")
				}
			}
			n += strings.Count(strings.TrimSuffix(s.text, "\n"), "\n") + 1
		}
		for j := 0; j < n; j++ {
			m[line+j] = i
		}
		line += n
	}
	return m
}

// comment renders text as # lines, one per line of text.
func comment(text string) string {
	var b strings.Builder
	for _, l := range strings.Split(text, "\n") {
		if l == "" {
			b.WriteString("#\n")
			continue
		}
		b.WriteString("# " + l + "\n")
	}
	return b.String()
}

// lit renders a value as an HCL literal (hclwrite escapes quotes, ${ and %{).
func lit(v cty.Value) string { return string(hclwrite.TokensForValue(v).Bytes()) }

func str(s string) string { return lit(cty.StringVal(s)) }

func strList(l []string) string {
	parts := make([]string, len(l))
	for i, s := range l {
		parts[i] = str(s)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// stringMap renders a map of strings, one entry per line, keys quoted.
func stringMap(m map[string]string, indent string) string {
	if len(m) == 0 {
		return "{}"
	}
	keys := sortedKeys(m)
	var b strings.Builder
	b.WriteString("{\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s  %s = %s\n", indent, str(k), str(m[k]))
	}
	b.WriteString(indent + "}")
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// flagValue renders one flag value: numbers as the server resource renders them.
func flagValue(v any) string {
	switch x := v.(type) {
	case bool:
		return fmt.Sprint(x)
	case float64:
		return cmdline.Number(big.NewFloat(x))
	case string:
		return str(x)
	}
	return str(fmt.Sprint(v))
}

func flagMap(flags map[string]any, indent string) string {
	if len(flags) == 0 {
		return "{}"
	}
	var b strings.Builder
	b.WriteString("{\n")
	for _, k := range sortedKeys(flags) {
		fmt.Fprintf(&b, "%s  %s = %s\n", indent, str(k), flagValue(flags[k]))
	}
	b.WriteString(indent + "}")
	return b.String()
}

// label turns a name into a resource label (letters, digits, _ and -, starting with a
// letter).
func label(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('_')
		}
	}
	out := b.String()
	if out == "" || !(out[0] >= 'a' && out[0] <= 'z' || out[0] >= 'A' && out[0] <= 'Z') {
		out = "x" + out
	}
	return out
}

func segments(h *Observation) []segment {
	var segs []segment
	head := []string{
		fmt.Sprintf("Exported by `agent export` from host %s at %s.", h.Hostname, h.ObservedAt.Format("2006-01-02 15:04:05Z")),
		"Review every comment marked \"guessed\" or TODO before applying this plan on another host.",
		"On this host: `agent apply` adopts the running servers (no restart, no signal);",
		"`agent plan` then says no changes. See docs/export.md.",
	}
	for _, n := range h.Notes {
		head = append(head, "note: "+n)
	}
	segs = append(segs, segment{comment: head})
	segs = append(segs, segment{
		comment: []string{"The guard: this plan runs on " + h.Hostname + " only. On the new host of a migration,", "pass --host-override " + h.Hostname + " (docs/runbooks/migrate-host.md)."},
		text:    fmt.Sprintf("host {\n  hostname = %s\n}\n", str(h.Hostname)),
	})
	if d := h.Driver; d != nil {
		c := []string{"The loaded NVIDIA kernel module (" + d.Source + ")."}
		for _, g := range d.GPUs {
			c = append(c, "gpu "+g)
		}
		c = append(c, "TODO: how to install it is not observable: add installer { url, sha256 } or package",
			"before applying on a host that lacks this driver.")
		segs = append(segs, segment{comment: c, text: fmt.Sprintf("nvidia_driver \"host\" {\n  version = %s\n}\n", str(d.Version))})
	}
	for _, k := range h.Containers {
		segs = append(segs, containerSegment(k))
	}
	for _, w := range h.Weights {
		segs = append(segs, weightsSegment(w))
	}
	for _, s := range h.Servers {
		segs = append(segs, serverSegment(h, s))
	}
	return segs
}

func containerSegment(k Container) segment {
	var b strings.Builder
	c := []string{fmt.Sprintf("Incus instance %s (%s).", k.Name, map[bool]string{true: "running", false: "stopped"}[k.Running])}
	fmt.Fprintf(&b, "container %s {\n", str(label(k.Name)))
	if label(k.Name) != k.Name {
		fmt.Fprintf(&b, "  name = %s\n", str(k.Name))
	}
	if k.ImageNote != "" {
		fmt.Fprintf(&b, "  # image: %s\n", k.ImageNote)
	}
	fmt.Fprintf(&b, "  image = %s\n", str(k.Image))
	if k.Type != "" && k.Type != "container" {
		fmt.Fprintf(&b, "  type = %s\n", str(k.Type))
	}
	fmt.Fprintf(&b, "  profiles = %s\n", strList(k.Profiles))
	if len(k.Config) > 0 {
		fmt.Fprintf(&b, "  config = %s\n", stringMap(k.Config, "  "))
	}
	if k.Description != "" {
		fmt.Fprintf(&b, "  description = %s\n", str(k.Description))
	}
	if !k.Running {
		b.WriteString("  running = false\n")
	}
	for _, name := range sortedKeys(k.Devices) {
		dev := k.Devices[name]
		switch {
		case dev["type"] == "gpu" && onlyKeys(dev, "type", "pci", "id", "vendorid", "productid", "gputype", "uid", "gid", "mode"):
			fmt.Fprintf(&b, "  gpu %s {\n", str(name))
			for _, key := range sortedKeys(dev) {
				if key != "type" {
					fmt.Fprintf(&b, "    %s = %s\n", key, str(dev[key]))
				}
			}
			b.WriteString("  }\n")
		case dev["type"] == "disk" && filepath.IsAbs(dev["source"]) && strings.HasPrefix(dev["path"], "/") &&
			onlyKeys(dev, "type", "source", "path", "readonly", "shift") && boolish(dev["readonly"]) && boolish(dev["shift"]):
			fmt.Fprintf(&b, "  disk %s {\n    source = %s\n    path = %s\n", str(name), str(dev["source"]), str(dev["path"]))
			if dev["readonly"] == "true" {
				b.WriteString("    readonly = true\n")
			}
			if dev["shift"] == "true" {
				b.WriteString("    shift = true\n")
			}
			b.WriteString("  }\n")
		default:
			opts := map[string]string{}
			for key, v := range dev {
				if key != "type" {
					opts[key] = v
				}
			}
			fmt.Fprintf(&b, "  device %s {\n    type = %s\n", str(name), str(dev["type"]))
			if len(opts) > 0 {
				fmt.Fprintf(&b, "    options = %s\n", stringMap(opts, "    "))
			}
			b.WriteString("  }\n")
		}
	}
	b.WriteString("}\n")
	return segment{comment: c, text: b.String()}
}

func onlyKeys(m map[string]string, keys ...string) bool {
	for k := range m {
		if !containsStr(keys, k) {
			return false
		}
	}
	return true
}

// boolish: "" or "true" (what the disk block can express; "false" is the default too,
// but Incus would then store a different map than the block produces).
func boolish(v string) bool { return v == "" || v == "true" }

func weightsSegment(w Weights) segment {
	name := label(filepath.Base(w.Dest))
	c := []string{fmt.Sprintf("Weights loaded by server pid %s: %d files, %d bytes.", joinInts(w.Servers), len(w.Files), w.Size)}
	if w.InContainer != "" {
		c = append(c, "Inside the container it is "+w.InContainer+".")
	}
	c = append(c, "TODO: where these files come from is not observable. Use a huggingface { repo, revision }",
		"block, or give each file's url (sha256 computed with `agent export --hash`), or copy the",
		"directory to the new host (docs/runbooks/migrate-host.md).")
	var b strings.Builder
	fmt.Fprintf(&b, "download %s {\n  dest = %s\n", str(name), str(w.Dest))
	for _, f := range w.Files {
		sum := f.SHA256
		if sum == "" {
			sum = "TODO"
		}
		fmt.Fprintf(&b, "  file %s {\n    url = \"TODO\"\n    sha256 = %s\n    size = %d\n  }\n", str(f.Name), str(sum), f.Size)
	}
	b.WriteString("}\n")
	return segment{comment: c, text: b.String()}
}

func joinInts(l []int) string {
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func serverSegment(h *Observation, s Server) segment {
	name := strings.ReplaceAll(s.Engine, ".", "_")
	if s.Port > 0 {
		name = fmt.Sprintf("%s_%d", name, s.Port)
	} else {
		name = fmt.Sprintf("%s_pid%d", name, s.PID)
	}
	c := []string{fmt.Sprintf("%s, pid %d, started %s.", s.Engine, s.PID, s.Started.Format("2006-01-02 15:04:05Z"))}
	if s.Log != "" {
		c = append(c, "Its stdout goes to "+s.Log+"; the agent writes "+name+".<generation>.log under log_dir when it launches it.")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server %s {\n", str(name))
	if s.Container != "" {
		found := false
		for _, k := range h.Containers {
			found = found || k.Name == s.Container
		}
		if !found {
			fmt.Fprintf(&b, "  # runs inside Incus instance %s, which was not exported (no Incus socket?)\n", s.Container)
		}
		fmt.Fprintf(&b, "  container = container.%s.name\n", label(s.Container))
	}
	if s.Canonical {
		fmt.Fprintf(&b, "  command = %s\n", strList(s.Command))
		fmt.Fprintf(&b, "  flags = %s\n", flagMap(s.Flags, "  "))
	} else {
		b.WriteString("  # The command line is kept verbatim: " + s.FlagsProblem + ",\n")
		b.WriteString("  # so a flags map would change it and the running server would not be adopted.\n")
		b.WriteString("  # The same flags as a map (one verified relaunch when you switch to it):\n")
		for _, l := range strings.Split("flags = "+flagMap(s.Flags, ""), "\n") {
			b.WriteString("  #   " + l + "\n")
		}
		fmt.Fprintf(&b, "  command = %s\n", strList(s.Argv))
	}
	if len(s.DroppedSecrets) > 0 {
		fmt.Fprintf(&b, "  # Left out as secrets (their names match TOKEN|SECRET|KEY|PASSWORD|AUTH): %s.\n", strings.Join(s.DroppedSecrets, ", "))
		b.WriteString("  # Set them from a sensitive variable or a token file before applying elsewhere.\n")
	}
	if len(s.DroppedSession) > 0 {
		fmt.Fprintf(&b, "  # Left out as the login session's, not the server's: %s.\n", strings.Join(s.DroppedSession, ", "))
	}
	if len(s.Env) > 0 {
		fmt.Fprintf(&b, "  env = %s\n", stringMap(s.Env, "  "))
	}
	if s.Workdir != "" && s.Workdir != "/" {
		fmt.Fprintf(&b, "  workdir = %s\n", str(s.Workdir))
	}
	if s.Port > 0 {
		if s.PortFrom == "socket" {
			b.WriteString("  # port: from the socket it listens on (no --port flag)\n")
		}
		fmt.Fprintf(&b, "  port = %d\n", s.Port)
		if r, ok := readiness[s.Engine]; ok {
			fmt.Fprintf(&b, "  # guessed: %s's usual health endpoint and ready line\n", s.Engine)
			fmt.Fprintf(&b, "  ready {\n    http = %s\n    log_line = %s\n  }\n", str(r[0]), str(r[1]))
		}
	}
	if s.Log != "" && filepath.IsAbs(s.Log) && !strings.HasPrefix(s.Log, "/dev/") {
		fmt.Fprintf(&b, "  # guessed: the directory of its current log\n  log_dir = %s\n", str(filepath.Dir(s.Log)))
	}
	b.WriteString("}\n")
	return segment{comment: c, text: b.String()}
}
