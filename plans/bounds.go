package plans

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/agent-dev/agent/internal/trust"
)

// Bounds on what a plan may ask of the parser and the evaluator. The agent runs as root on
// hosts whose memory is meant for models: a plan file (or a -var-file, or a -var value)
// must not be able to crash it with a stack overflow or take gigabytes to evaluate. HCL's
// parser is recursive descent, so a few megabytes of "[[[[…" or "!!!!…" overflow Go's
// 1 GB stack, a fatal error no recover catches; the bounds are checked on the lexer's
// tokens (the lexer is not recursive) before anything is parsed.
const (
	// MaxNesting is how deeply brackets, braces, parentheses, strings and template
	// interpolations may nest.
	MaxNesting = 64
	// MaxUnaryRun is how many unary operators (! and -) may follow each other.
	MaxUnaryRun = 16
	// MaxConditionals is how many conditional operators (?) one file may hold: a chain
	// of them nests in the parser like brackets do.
	MaxConditionals = 1000
	// MaxForNesting is how deeply for expressions may nest: range() yields at most 1024
	// elements, so two nested levels make at most a million, three a billion.
	MaxForNesting = 2
	// MaxFormatWidth bounds the width and precision in format() and formatlist() verbs:
	// format("%1000000000s", "") would otherwise allocate a gigabyte.
	MaxFormatWidth = 1 << 16
	// MaxIndent bounds indent()'s count of spaces.
	MaxIndent = 1 << 10
)

// ErrTooDeep is wrapped by the diagnostics of a source past one of the bounds.
var ErrTooDeep = errors.New("plan source too deeply nested")

// maxLexConfirm is the largest source lexed whole to confirm what the byte scan suspects
// (lexing costs a few hundred bytes per token).
const maxLexConfirm = 256 << 10

// checkBounds reports the first bound src passes, as a diagnostic at the token that
// passed it. A scan of the bytes, which counts brackets and operators inside strings and
// comments too, clears ordinary sources without allocating; what it suspects is confirmed
// with the lexer, on the prefix up to the suspect byte, then on the whole source when that
// is small. A large source the scan suspects and the lexer cannot clear cheaply is refused.
func checkBounds(name string, src []byte) hcl.Diagnostics {
	at := scanBounds(src)
	if at < 0 {
		return nil
	}
	if d := lexBounds(name, src[:at+1]); d != nil {
		return d
	}
	if len(src) <= maxLexConfirm {
		return lexBounds(name, src)
	}
	pos := hcl.Pos{Line: 1 + bytes.Count(src[:at], []byte("\n")), Byte: at}
	pos.Column = at - bytes.LastIndexByte(src[:at], '\n')
	return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Nested too deeply",
		Detail:  fmt.Sprintf("Brackets or operators nest past the plan limits (%d levels, %d unary operators in a row, %d conditionals), and the file is too large (over %d bytes) to tell whether they are inside strings.", MaxNesting, MaxUnaryRun, MaxConditionals, maxLexConfirm),
		Subject: &hcl.Range{Filename: name, Start: pos, End: pos}}}
}

// scanBounds returns the offset of the first byte at which a raw count of src passes a
// bound, or -1.
func scanBounds(src []byte) int {
	var isFor [MaxNesting/2 + 2]bool // per level: opened a for expression
	depth, forDepth, unary, conds := 0, 0, 0, 0
	for i, c := range src {
		opens := c == '(' || c == '[' || c == '{' || (c == '$' || c == '%') && i+1 < len(src) && src[i+1] == '{'
		if c == '{' && i > 0 && (src[i-1] == '$' || src[i-1] == '%') {
			opens = false // counted at the $ or %
		}
		switch {
		case opens:
			depth++
			if depth > 0 && depth < len(isFor) {
				isFor[depth] = (c == '[' || c == '{') && startsFor(src[i+1:])
				if isFor[depth] {
					forDepth++
				}
			}
		case c == ')' || c == ']' || c == '}':
			if depth > 0 && depth < len(isFor) && isFor[depth] {
				isFor[depth] = false
				forDepth--
			}
			depth--
		case c == '?':
			conds++
		}
		switch c {
		case '!', '-':
			unary++
		case ' ', '\t', '\r', '\n':
		default:
			unary = 0
		}
		if depth > MaxNesting/2 || forDepth > MaxForNesting || unary > MaxUnaryRun || conds > MaxConditionals {
			return i
		}
	}
	return -1
}

// startsFor reports whether b starts with optional blanks, "for" and a blank.
func startsFor(b []byte) bool {
	b = bytes.TrimLeft(b, " \t\r\n")
	return len(b) > 3 && string(b[:3]) == "for" && (b[3] == ' ' || b[3] == '\t' || b[3] == '\n' || b[3] == '\r')
}

// lexBounds checks src's tokens against the bounds.
func lexBounds(name string, src []byte) hcl.Diagnostics {
	toks, _ := hclsyntax.LexConfig(src, name, hcl.InitialPos) // lexing errors are the parser's to report
	type open struct{ isFor bool }
	var stack []open
	forDepth, unary, conds := 0, 0, 0
	bad := func(t hclsyntax.Token, summary, detail string) hcl.Diagnostics {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: t.Range.Ptr()}}
	}
	for i, t := range toks {
		if t.Type == hclsyntax.TokenBang || t.Type == hclsyntax.TokenMinus {
			if unary++; unary > MaxUnaryRun {
				return bad(t, "Too many unary operators", fmt.Sprintf("More than %d ! or - operators in a row; plans are limited to %d.", MaxUnaryRun, MaxUnaryRun))
			}
		} else {
			unary = 0
		}
		switch t.Type {
		case hclsyntax.TokenOBrace, hclsyntax.TokenOBrack, hclsyntax.TokenOParen, hclsyntax.TokenOQuote,
			hclsyntax.TokenOHeredoc, hclsyntax.TokenTemplateInterp, hclsyntax.TokenTemplateControl:
			o := open{}
			if (t.Type == hclsyntax.TokenOBrace || t.Type == hclsyntax.TokenOBrack) && i+1 < len(toks) &&
				toks[i+1].Type == hclsyntax.TokenIdent && string(toks[i+1].Bytes) == "for" {
				o.isFor = true
				if forDepth++; forDepth > MaxForNesting {
					return bad(toks[i+1], "For expressions nested too deeply", fmt.Sprintf("More than %d nested for expressions; plans are limited to %d (each may yield a thousand elements).", MaxForNesting, MaxForNesting))
				}
			}
			stack = append(stack, o)
			if len(stack) > MaxNesting {
				return bad(t, "Nested too deeply", fmt.Sprintf("Brackets, braces, parentheses, strings and interpolations nest more than %d deep; plans are limited to %d.", MaxNesting, MaxNesting))
			}
		case hclsyntax.TokenCBrace, hclsyntax.TokenCBrack, hclsyntax.TokenCParen, hclsyntax.TokenCQuote,
			hclsyntax.TokenCHeredoc, hclsyntax.TokenTemplateSeqEnd:
			if n := len(stack); n > 0 {
				if stack[n-1].isFor {
					forDepth--
				}
				stack = stack[:n-1]
			}
		case hclsyntax.TokenQuestion:
			if conds++; conds > MaxConditionals {
				return bad(t, "Too many conditionals", fmt.Sprintf("More than %d conditional (?) operators in one file; plans are limited to %d.", MaxConditionals, MaxConditionals))
			}
		}
	}
	return nil
}

// formatWidthOK reports whether every width, precision and argument index in a format
// string is at most MaxFormatWidth.
func formatWidthOK(f string) error {
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			continue
		}
		for i++; i < len(f) && f[i] != '%' && !isLetter(f[i]); i++ {
			j := i
			for j < len(f) && f[j] >= '0' && f[j] <= '9' {
				j++
			}
			if j > i {
				n, err := strconv.Atoi(f[i:j])
				if err != nil || n > MaxFormatWidth {
					return fmt.Errorf("width or precision %s is larger than %d", f[i:j], MaxFormatWidth)
				}
				i = j - 1
			}
		}
	}
	return nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// ErrInsecurePlan is wrapped by the error for a plan file other users could have written.
var ErrInsecurePlan = errors.New("plan file writable by other users")

// CheckOwnership is sshd's StrictModes for a plan file (or -var-file) read by an agent
// running as euid 0 (internal/trust): the file (after symlinks), the directory holding it
// and every directory above must be owned by root and not writable by group or others. A
// group- or world-writable file lets another user make root run any command (a server's
// argv); a writable directory lets them replace the file, or add a *.hcl file to a
// directory plan. A directory with the sticky bit (/tmp) is accepted above a single file,
// since others cannot replace a file they do not own there, but never as a directory
// plan. Other euids are not checked: a user's plan is theirs.
func CheckOwnership(path string, euid int, isDirPlan bool) error {
	if euid != 0 {
		return nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		err = trust.Dir(path)
	} else {
		err = trust.File(path, isDirPlan)
	}
	if errors.Is(err, trust.ErrUntrusted) {
		return fmt.Errorf("%w: %w", ErrInsecurePlan, err)
	}
	return err
}
