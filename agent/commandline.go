package agent

import (
	"path"
	"regexp"
	"strings"
)

// CommandLine is an argv as a diff value. --json emits it as the list of strings it is;
// the human view writes it as a person would type it: the program on the first line, then
// one flag with its values per line, shell-quoted only where needed. A change from one
// command line to another shows only the flags that differ (`~ --mem-fraction-static 0.85
// → 0.8`), not two long escaped lists to compare by eye.
type CommandLine []string

// String is the command line on one line, shell-quoted where needed.
func (c CommandLine) String() string {
	q := make([]string, len(c))
	for i, w := range c {
		q[i] = ShellQuote(w)
	}
	return strings.Join(q, " ")
}

// cmdGroup is the program (key "") or one flag (key "--name") with the words after it up
// to the next flag.
type cmdGroup struct {
	key   string
	words []string
}

func (g cmdGroup) String() string { return CommandLine(g.words).String() }

// groups splits c into the program with its leading arguments and one group per flag.
// `--name=value` is keyed by --name; a negative number is a value, not a flag. A Python
// interpreter's `-m MODULE` belongs to the program: `python3 -m sglang.launch_server` is
// what runs, not a flag of it.
func (c CommandLine) groups() []cmdGroup {
	var out []cmdGroup
	module := len(c) > 2 && strings.HasPrefix(path.Base(c[0]), "python") && c[1] == "-m"
	for i, w := range c {
		if i == 0 || !isFlag(w) || module && i == 1 {
			if len(out) == 0 {
				out = append(out, cmdGroup{})
			}
			out[len(out)-1].words = append(out[len(out)-1].words, w)
			continue
		}
		key, _, _ := strings.Cut(w, "=")
		out = append(out, cmdGroup{key: key, words: []string{w}})
	}
	return out
}

var negativeNumber = regexp.MustCompile(`^-[0-9.]`)

func isFlag(w string) bool {
	return strings.HasPrefix(w, "-") && w != "-" && !negativeNumber.MatchString(w)
}

// lines is c for people: the program, then one flag per line.
func (c CommandLine) lines() []string {
	var out []string
	for _, g := range c.groups() {
		out = append(out, g.String())
	}
	return out
}

// commandLineDiff lists, line by line, how new differs from old: `~ --flag old → new`,
// `+ --flag value`, `- --flag value`, in the new command line's order (removed flags
// after). A flag given twice is compared as a whole.
func commandLineDiff(old, new CommandLine) []string {
	index := func(c CommandLine) (map[string]string, []string) {
		m := map[string]string{}
		var order []string
		for _, g := range c.groups() {
			if _, seen := m[g.key]; seen {
				m[g.key] += " " + g.String()
				continue
			}
			m[g.key] = g.String()
			order = append(order, g.key)
		}
		return m, order
	}
	o, oOrder := index(old)
	n, nOrder := index(new)
	var out []string
	for _, k := range nOrder {
		ov, had := o[k]
		switch {
		case !had:
			out = append(out, "+ "+n[k])
		case ov != n[k]:
			if k == "" {
				out = append(out, "~ "+ov+" → "+n[k])
				continue
			}
			value := func(s string) string { return strings.TrimLeft(strings.TrimPrefix(s, k), " =") }
			out = append(out, "~ "+k+" "+value(ov)+" → "+value(n[k]))
		}
	}
	for _, k := range oOrder {
		if _, has := n[k]; !has {
			out = append(out, "- "+o[k])
		}
	}
	return out
}

// ShellQuote returns w as a POSIX shell reads it back: bare when it holds only characters
// that need no quoting, else in single quotes.
func ShellQuote(w string) string {
	if w == "" {
		return "''"
	}
	safe := true
	for _, r := range w {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%^", r)) {
			safe = false
			break
		}
	}
	if safe {
		return w
	}
	return "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
}
