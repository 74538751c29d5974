package main

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// prog is what argparse prints as the program name for
// `python3 -m sglang.launch_server`: the basename of the module file.
const prog = "launch_server.py"

type argType int

const (
	typeStr argType = iota
	typeInt
	typeFloat
	typeBool // store_true
)

type argSpec struct {
	names []string // long names, first is canonical: "--tp-size", "--tensor-parallel-size"
	typ   argType
	def   string
}

// specs lists the SGLang launch flags the fake knows (a subset of ServerArgs).
var specs = []argSpec{
	{names: []string{"--model-path", "--model"}},
	{names: []string{"--tokenizer-path"}},
	{names: []string{"--host"}, def: "127.0.0.1"},
	{names: []string{"--port"}, typ: typeInt, def: "30000"},
	{names: []string{"--tp-size", "--tensor-parallel-size"}, typ: typeInt, def: "1"},
	{names: []string{"--dp-size", "--data-parallel-size"}, typ: typeInt, def: "1"},
	{names: []string{"--pp-size", "--pipeline-parallel-size"}, typ: typeInt, def: "1"},
	{names: []string{"--mem-fraction-static"}, typ: typeFloat},
	{names: []string{"--max-running-requests"}, typ: typeInt},
	{names: []string{"--max-total-tokens"}, typ: typeInt},
	{names: []string{"--max-prefill-tokens"}, typ: typeInt, def: "16384"},
	{names: []string{"--chunked-prefill-size"}, typ: typeInt},
	{names: []string{"--context-length"}, typ: typeInt},
	{names: []string{"--cuda-graph-max-bs"}, typ: typeInt},
	{names: []string{"--disable-cuda-graph"}, typ: typeBool},
	{names: []string{"--disable-radix-cache"}, typ: typeBool},
	{names: []string{"--enable-torch-compile"}, typ: typeBool},
	{names: []string{"--speculative-algorithm"}},
	{names: []string{"--speculative-draft-model-path", "--speculative-draft-model"}},
	{names: []string{"--speculative-num-steps"}, typ: typeInt},
	{names: []string{"--speculative-eagle-topk"}, typ: typeInt},
	{names: []string{"--speculative-num-draft-tokens"}, typ: typeInt},
	{names: []string{"--mamba-full-memory-ratio"}, typ: typeFloat, def: "0.9"},
	{names: []string{"--max-mamba-cache-size"}, typ: typeInt},
	{names: []string{"--mamba-ssm-dtype"}, def: "float32"},
	{names: []string{"--enable-metrics"}, typ: typeBool},
	{names: []string{"--served-model-name"}},
	{names: []string{"--log-level"}, def: "info"},
	{names: []string{"--log-requests"}, typ: typeBool},
	{names: []string{"--trust-remote-code"}, typ: typeBool},
	{names: []string{"--dtype"}, def: "auto"},
	{names: []string{"--kv-cache-dtype"}, def: "auto"},
	{names: []string{"--quantization"}},
	{names: []string{"--attention-backend"}},
	{names: []string{"--reasoning-parser"}},
	{names: []string{"--tool-call-parser"}},
	{names: []string{"--chat-template"}},
	{names: []string{"--random-seed"}, typ: typeInt},
	{names: []string{"--api-key"}},
	{names: []string{"--schedule-policy"}, def: "fcfs"},
	{names: []string{"--decode-log-interval"}, typ: typeInt, def: "40"},
	{names: []string{"--watchdog-timeout"}, typ: typeFloat, def: "300"},
	{names: []string{"--revision"}},
	{names: []string{"--page-size"}, typ: typeInt, def: "1"},
	{names: []string{"--skip-server-warmup"}, typ: typeBool},
	{names: []string{"--enable-p2p-check"}, typ: typeBool},
	{names: []string{"--allow-auto-truncate"}, typ: typeBool},
	{names: []string{"--json-model-override-args"}, def: "{}"},
}

// args holds parsed flags by canonical name without dashes ("tp-size").
type args struct {
	vals map[string]string
	set  map[string]bool
}

func (a args) str(name string) string { return a.vals[name] }

func (a args) on(name string) bool { return a.vals[name] == "true" }

func (a args) int(name string) int {
	n, _ := strconv.Atoi(a.vals[name])
	return n
}

func (a args) float(name string) float64 {
	f, _ := strconv.ParseFloat(a.vals[name], 64)
	return f
}

// argError is argparse's failure: usage and "prog: error: msg" on stderr,
// exit status 2.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// errHelp asks for the help text (exit 0).
var errHelp = &argError{msg: "help"}

func canonical(s argSpec) string { return strings.TrimPrefix(s.names[0], "--") }

// lookup finds the spec for an option string, allowing unique prefixes as
// argparse does (allow_abbrev: --speculative-algo works).
func lookup(opt string) (argSpec, string, error) {
	var matches []string
	var found []argSpec
	for _, s := range specs {
		for _, n := range s.names {
			if n == opt {
				return s, n, nil
			}
		}
	}
	for _, s := range specs {
		for _, n := range s.names {
			if strings.HasPrefix(n, opt) {
				matches = append(matches, n)
				found = append(found, s)
			}
		}
	}
	switch len(matches) {
	case 0:
		return argSpec{}, "", nil
	case 1:
		return found[0], matches[0], nil
	}
	return argSpec{}, "", &argError{msg: fmt.Sprintf("ambiguous option: %s could match %s", opt, strings.Join(matches, ", "))}
}

func typeName(t argType) string {
	switch t {
	case typeInt:
		return "int"
	case typeFloat:
		return "float"
	}
	return "str"
}

// parseArgs parses argv (without the program) like SGLang's ArgumentParser.
func parseArgs(argv []string) (args, error) {
	a := args{vals: map[string]string{}, set: map[string]bool{}}
	for _, s := range specs {
		if s.typ == typeBool {
			a.vals[canonical(s)] = "false"
		} else if s.def != "" {
			a.vals[canonical(s)] = s.def
		}
	}
	var extras []string
	for i := 0; i < len(argv); i++ {
		tok := argv[i]
		if tok == "-h" || tok == "--help" {
			return a, errHelp
		}
		if !strings.HasPrefix(tok, "-") || tok == "-" {
			extras = append(extras, tok)
			continue
		}
		opt, val, hasVal := strings.Cut(tok, "=")
		s, name, err := lookup(opt)
		if err != nil {
			return a, err
		}
		if name == "" {
			extras = append(extras, tok)
			continue
		}
		disp := strings.Join(s.names, "/")
		if s.typ == typeBool {
			if hasVal {
				return a, &argError{msg: fmt.Sprintf("argument %s: ignored explicit argument '%s'", disp, val)}
			}
			a.vals[canonical(s)] = "true"
			a.set[canonical(s)] = true
			continue
		}
		if !hasVal {
			if i+1 >= len(argv) || (strings.HasPrefix(argv[i+1], "-") && !isNumber(argv[i+1])) {
				return a, &argError{msg: fmt.Sprintf("argument %s: expected one argument", disp)}
			}
			i++
			val = argv[i]
		}
		switch s.typ {
		case typeInt:
			if _, err := strconv.Atoi(val); err != nil {
				return a, &argError{msg: fmt.Sprintf("argument %s: invalid int value: '%s'", disp, val)}
			}
		case typeFloat:
			if _, err := strconv.ParseFloat(val, 64); err != nil {
				return a, &argError{msg: fmt.Sprintf("argument %s: invalid float value: '%s'", disp, val)}
			}
		}
		a.vals[canonical(s)] = val
		a.set[canonical(s)] = true
	}
	if !a.set["model-path"] {
		return a, &argError{msg: "the following arguments are required: --model-path/--model"}
	}
	if len(extras) > 0 {
		return a, &argError{msg: "unrecognized arguments: " + strings.Join(extras, " ")}
	}
	if a.vals["tokenizer-path"] == "" {
		a.vals["tokenizer-path"] = a.vals["model-path"]
	}
	if a.vals["served-model-name"] == "" {
		a.vals["served-model-name"] = a.vals["model-path"]
	}
	return a, nil
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// usage renders argparse's usage block, wrapped the way argparse wraps it.
func usage() string {
	parts := []string{"[-h]"}
	for _, s := range specs {
		n := s.names[0]
		meta := strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(n, "--"), "-", "_"))
		switch {
		case n == "--model-path":
			parts = append(parts, n+" "+meta)
		case s.typ == typeBool:
			parts = append(parts, "["+n+"]")
		default:
			parts = append(parts, "["+n+" "+meta+"]")
		}
	}
	head := "usage: " + prog + " "
	indent := strings.Repeat(" ", len(head))
	var b strings.Builder
	line := head
	for i, p := range parts {
		if i > 0 && len(line)+1+len(p) > 79 {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		} else if i > 0 {
			line += " "
		}
		line += p
	}
	b.WriteString(line + "\n")
	return b.String()
}

// help renders a short help text.
func help() string {
	var b strings.Builder
	b.WriteString(usage())
	b.WriteString("\noptions:\n  -h, --help            show this help message and exit\n")
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, strings.Join(s.names, ", "))
	}
	sort.Strings(names)
	for _, n := range names {
		b.WriteString("  " + n + "\n")
	}
	return b.String()
}
