package view

import (
	"path"
	"regexp"
	"strings"

	"github.com/agent-dev/agent/agent"
)

// How the human view writes an agent.CommandLine: one flag with its values per line,
// and, for a change, only the flags that differ.

// cmdGroup is the program (key "") or one flag (key "--name") with the words after it up
// to the next flag.
type cmdGroup struct {
	key   string
	words []string
}

func (g cmdGroup) String() string { return agent.CommandLine(g.words).String() }

// groups splits c into the program with its leading arguments and one group per flag.
// `--name=value` is keyed by --name; a negative number is a value, not a flag. A Python
// interpreter's `-m MODULE` belongs to the program: `python3 -m sglang.launch_server` is
// what runs, not a flag of it.
func groups(c agent.CommandLine) []cmdGroup {
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

// commandLines is c for people: the program, then one flag per line.
func commandLines(c agent.CommandLine) []string {
	var out []string
	for _, g := range groups(c) {
		out = append(out, g.String())
	}
	return out
}

// commandLineDiff lists, line by line, how new differs from old: `~ --flag old → new`,
// `+ --flag value`, `- --flag value`, in the new command line's order (removed flags
// after). A flag given twice is compared as a whole.
func commandLineDiff(old, new agent.CommandLine) []string {
	index := func(c agent.CommandLine) (map[string]string, []string) {
		m := map[string]string{}
		var order []string
		for _, g := range groups(c) {
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
