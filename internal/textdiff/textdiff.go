// Package textdiff renders unified diffs of file content for plan output: what an
// operator reads before a file on the host is rewritten.
package textdiff

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLines bounds the inputs that are diffed line by line; larger or binary content is
// summarised by size, since nobody reviews a 10 000-line diff in a terminal.
const MaxLines = 5000

// context is the number of unchanged lines shown around each change.
const context = 3

// Unified returns a unified diff from old to new, labelled with name, or "" when they are
// equal. A nil old means the file does not exist yet.
func Unified(name string, old, new []byte) string {
	if bytes.Equal(old, new) && old != nil {
		return ""
	}
	if !utf8.Valid(old) || !utf8.Valid(new) || bytes.IndexByte(old, 0) >= 0 || bytes.IndexByte(new, 0) >= 0 {
		return fmt.Sprintf("binary content: %d bytes → %d bytes\n", len(old), len(new))
	}
	a, b := splitLines(old), splitLines(new)
	if len(a) > MaxLines || len(b) > MaxLines {
		return fmt.Sprintf("%d lines → %d lines (too long to show)\n", len(a), len(b))
	}
	ops := diff(a, b)
	var out strings.Builder
	oldName := name
	if old == nil {
		oldName = "/dev/null"
	}
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", oldName, name)
	for _, h := range hunks(ops) {
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", span(h.aStart, h.aLen), span(h.bStart, h.bLen))
		for _, o := range h.ops {
			out.WriteString(string(o.kind) + o.text)
			if !strings.HasSuffix(o.text, "\n") {
				out.WriteString("\n\\ No newline at end of file\n")
			}
		}
	}
	return out.String()
}

func span(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start + 1)
	}
	if n == 0 {
		return fmt.Sprintf("%d,0", start)
	}
	return fmt.Sprintf("%d,%d", start+1, n)
}

func splitLines(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	var out []string
	for len(s) > 0 {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			out = append(out, s)
			break
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

type op struct {
	kind byte // ' ', '-', '+'
	text string
	a, b int // line index in a and b before this op
}

// diff computes a shortest edit script with Myers' O(ND) algorithm.
func diff(a, b []string) []op {
	n, m := len(a), len(b)
	max := n + m
	v := make([]int, 2*max+2)
	var trace [][]int
	for d := 0; d <= max; d++ {
		trace = append(trace, append([]int(nil), v...))
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[max+k-1] < v[max+k+1]) {
				x = v[max+k+1]
			} else {
				x = v[max+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x, y = x+1, y+1
			}
			v[max+k] = x
			if x >= n && y >= m {
				return backtrack(trace, a, b, max, d)
			}
		}
	}
	return nil
}

func backtrack(trace [][]int, a, b []string, max, d int) []op {
	x, y := len(a), len(b)
	var ops []op
	for ; d > 0; d-- {
		v := trace[d]
		k := x - y
		var prevK int
		if k == -d || (k != d && v[max+k-1] < v[max+k+1]) {
			prevK = k + 1
		} else {
			prevK = k - 1
		}
		prevX := v[max+prevK]
		prevY := prevX - prevK
		for x > prevX && y > prevY {
			x, y = x-1, y-1
			ops = append(ops, op{' ', a[x], x, y})
		}
		if x == prevX {
			y--
			ops = append(ops, op{'+', b[y], x, y})
		} else {
			x--
			ops = append(ops, op{'-', a[x], x, y})
		}
	}
	for x > 0 && y > 0 {
		x, y = x-1, y-1
		ops = append(ops, op{' ', a[x], x, y})
	}
	for i, j := 0, len(ops)-1; i < j; i, j = i+1, j-1 {
		ops[i], ops[j] = ops[j], ops[i]
	}
	return ops
}

type hunk struct {
	aStart, aLen, bStart, bLen int
	ops                        []op
}

// hunks groups changes with up to `context` unchanged lines around them.
func hunks(ops []op) []hunk {
	var out []hunk
	i := 0
	for i < len(ops) {
		for i < len(ops) && ops[i].kind == ' ' {
			i++
		}
		if i == len(ops) {
			break
		}
		start := max(0, i-context)
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*context {
				end = min(end+context, len(ops))
				break
			}
			end = run
		}
		h := hunk{aStart: ops[start].a, bStart: ops[start].b, ops: ops[start:end]}
		for _, o := range h.ops {
			if o.kind != '+' {
				h.aLen++
			}
			if o.kind != '-' {
				h.bLen++
			}
		}
		out = append(out, h)
		i = end
	}
	return out
}
