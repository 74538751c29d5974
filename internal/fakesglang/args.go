package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// The flag table (specs, parserProg) is generated from SGLang's own server_args.py by
// scripts/gen-sglang-flags.py into flags_gen.go; docs/serving-logs.md says how to
// refresh it. (No go:generate: the script needs a checkout of SGLang to read.)

type argType int

const (
	typeStr      argType = iota
	typeInt              // type=int
	typeFloat            // type=float
	typeJSON             // type=json.loads or json_list_type
	typeHumanInt         // type=human_readable_int: 32k, 1Mi, 25.6k
	typeBool             // store_true and the deprecated flags: no value
	typeBoolOpt          // argparse.BooleanOptionalAction: --x / --no-x
)

type argSpec struct {
	names    []string // option strings; the first is the canonical one, the rest aliases
	typ      argType
	nargs    string   // "", "?", "*", "+" or a count
	choices  []string // nil: any value
	required bool
	def      string
}

// entry is how the fake was started, as SGLang is: `python3 -m sglang.launch_server`
// (the fake's plain form) or `sglang serve` (argv[0] named sglang, or a first argument
// "serve").
type entry int

const (
	entryModule entry = iota
	entryServe
)

// prog is what argparse prints as the program name. SGLang builds its parser with
// ArgumentParser(prog="sglang serve") for both entry points since 2026; before that
// `python -m sglang.launch_server` printed the module file's name.
func (e entry) prog() string {
	switch {
	case parserProg != "":
		return parserProg
	case e == entryServe:
		return "sglang serve"
	}
	return "launch_server.py"
}

// entryOf tells the entry point from argv (with the program) and returns the
// arguments the server parser sees: for `sglang serve` the word serve is dropped, a
// leading MODEL becomes --model-path MODEL and --model-type is taken out, as
// sglang/cli/serve.py does.
func entryOf(argv []string) (entry, []string) {
	rest := argv[1:]
	switch {
	case len(rest) > 0 && rest[0] == "serve":
		rest = rest[1:]
	case filepath.Base(argv[0]) == "sglang":
	default:
		return entryModule, rest
	}
	var out []string
	for i := 0; i < len(rest); i++ {
		switch {
		case rest[i] == "--model-type" && i+1 < len(rest):
			i++
		case strings.HasPrefix(rest[i], "--model-type="):
		default:
			out = append(out, rest[i])
		}
	}
	if len(out) > 0 && !strings.HasPrefix(out[0], "-") {
		out = append([]string{"--model-path"}, out...)
	}
	return entryServe, out
}

// args holds parsed flags by every name of their spec, without dashes ("tp-size" and
// "tensor-parallel-size" both).
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

func (a args) put(s argSpec, v string) {
	for _, n := range s.names {
		if s.typ == typeBoolOpt && strings.HasPrefix(n, "--no-") {
			continue
		}
		a.vals[strings.TrimPrefix(n, "--")] = v
		a.set[strings.TrimPrefix(n, "--")] = true
	}
}

// argError is argparse's failure: usage and "prog: error: msg" on stderr,
// exit status 2.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// errHelp asks for the help text (exit 0).
var errHelp = &argError{msg: "help"}

// lookup finds the spec for an option string, allowing unique prefixes as
// argparse does (allow_abbrev: --speculative-algo works).
func lookup(opt string) (argSpec, string, error) {
	for _, s := range specs {
		for _, n := range s.names {
			if n == opt {
				return s, n, nil
			}
		}
	}
	var matches []string
	var found []argSpec
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

var humanInt = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(k|M|G|T|Ki|Mi|Gi|Ti)?$`)

// convert checks one value the way the spec's type= would, returning it normalised.
func convert(s argSpec, disp, v string) (string, error) {
	bad := func(name string) error {
		return &argError{msg: fmt.Sprintf("argument %s: invalid %s value: '%s'", disp, name, v)}
	}
	switch s.typ {
	case typeInt:
		if _, err := strconv.Atoi(strings.TrimSpace(v)); err != nil {
			return "", bad("int")
		}
	case typeFloat:
		if _, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil {
			return "", bad("float")
		}
	case typeJSON:
		if !json.Valid([]byte(v)) {
			return "", bad("loads")
		}
	case typeHumanInt:
		m := humanInt.FindStringSubmatch(strings.TrimSpace(v))
		if m == nil || (strings.Contains(m[1], ".") && (m[2] == "" || strings.HasSuffix(m[2], "i"))) {
			return "", bad("human_readable_int")
		}
		f, _ := strconv.ParseFloat(m[1], 64)
		mult := map[string]float64{"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m[2]]
		v = strconv.FormatInt(int64(f*mult), 10)
	}
	if s.choices != nil {
		ok := false
		for _, c := range s.choices {
			if c == v {
				ok = true
			}
		}
		if !ok {
			q := func(x string) string {
				if s.typ == typeInt || s.typ == typeFloat {
					return x
				}
				return "'" + x + "'"
			}
			quoted := make([]string, len(s.choices))
			for i, c := range s.choices {
				quoted[i] = q(c)
			}
			return "", &argError{msg: fmt.Sprintf("argument %s: invalid choice: %s (choose from %s)", disp, q(v), strings.Join(quoted, ", "))}
		}
	}
	return v, nil
}

// parseArgs parses the server parser's arguments like SGLang's ArgumentParser.
func parseArgs(argv []string) (args, error) {
	a := args{vals: map[string]string{}, set: map[string]bool{}}
	for _, s := range specs {
		switch {
		case s.typ == typeBool || s.typ == typeBoolOpt:
			a.put(s, "false")
		case s.def != "":
			a.put(s, s.def)
		}
	}
	clear(a.set)
	var extras []string
	isValue := func(tok string) bool { return !strings.HasPrefix(tok, "-") || tok == "-" || isNumber(tok) }
	for i := 0; i < len(argv); i++ {
		tok := argv[i]
		if tok == "-h" || tok == "--help" {
			return a, errHelp
		}
		if !strings.HasPrefix(tok, "-") || tok == "-" || isNumber(tok) {
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
		if s.typ == typeBool || s.typ == typeBoolOpt {
			if hasVal {
				return a, &argError{msg: fmt.Sprintf("argument %s: ignored explicit argument '%s'", disp, val)}
			}
			a.put(s, strconv.FormatBool(!strings.HasPrefix(name, "--no-")))
			continue
		}
		var vals []string
		switch {
		case hasVal:
			vals = []string{val}
		case s.nargs == "" || s.nargs == "1":
			if i+1 >= len(argv) || !isValue(argv[i+1]) {
				return a, &argError{msg: fmt.Sprintf("argument %s: expected one argument", disp)}
			}
			i++
			vals = []string{argv[i]}
		case s.nargs == "?" || s.nargs == "*" || s.nargs == "+":
			for i+1 < len(argv) && isValue(argv[i+1]) && (s.nargs != "?" || len(vals) == 0) {
				i++
				vals = append(vals, argv[i])
			}
			if s.nargs == "+" && len(vals) == 0 {
				return a, &argError{msg: fmt.Sprintf("argument %s: expected at least one argument", disp)}
			}
		default: // a count
			n, _ := strconv.Atoi(s.nargs)
			for len(vals) < n && i+1 < len(argv) && isValue(argv[i+1]) {
				i++
				vals = append(vals, argv[i])
			}
			if len(vals) < n {
				return a, &argError{msg: fmt.Sprintf("argument %s: expected %d arguments", disp, n)}
			}
		}
		for j, v := range vals {
			if vals[j], err = convert(s, disp, v); err != nil {
				return a, err
			}
		}
		a.put(s, strings.Join(vals, " "))
	}
	var missing []string
	for _, s := range specs {
		if s.required && !a.set[strings.TrimPrefix(s.names[0], "--")] {
			missing = append(missing, strings.Join(s.names, "/"))
		}
	}
	if len(missing) > 0 {
		return a, &argError{msg: "the following arguments are required: " + strings.Join(missing, ", ")}
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
func usage(prog string) string {
	parts := []string{"[-h]"}
	for _, s := range specs {
		n := s.names[0]
		meta := strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(n, "--"), "-", "_"))
		if s.choices != nil {
			meta = "{" + strings.Join(s.choices, ",") + "}"
		}
		switch s.nargs {
		case "?":
			meta = "[" + meta + "]"
		case "*":
			meta = "[" + meta + " ...]"
		case "+":
			meta = meta + " [" + meta + " ...]"
		}
		switch {
		case s.typ == typeBool:
			parts = append(parts, "["+n+"]")
		case s.typ == typeBoolOpt:
			parts = append(parts, "["+strings.Join(s.names, " | ")+"]")
		case s.required:
			parts = append(parts, n+" "+meta)
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

// help renders a short help text: the usage and every option with its aliases.
func help(prog string) string {
	var b strings.Builder
	b.WriteString(usage(prog))
	b.WriteString("\noptions:\n  -h, --help            show this help message and exit\n")
	for _, s := range specs {
		b.WriteString("  " + strings.Join(s.names, ", ") + "\n")
	}
	return b.String()
}
