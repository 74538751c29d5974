// Package view is what people and machines read of the engine's work: the human
// rendering of plan, apply, destroy and status reports (View), the versioned --json
// document (JSON), a diff's changes in the log (LogChanges), the redaction of secrets
// from all of them (Redactor, RedactingHandler), and the drawing of long work's progress
// (Progress). It is fed only the engine's typed data: Reports, Events and Progress.
// The engine knows nothing of terminals or formats; a kind reports what it does as data
// and never prints.
package view

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agent-dev/agent/agent"
)

// View renders reports for people.
type View struct {
	W io.Writer
	// Term, when not nil, is the interactive terminal where long work's progress is
	// drawn as bars redrawn in place (WorkProgress); nil: progress is a line on W every
	// ProgressEvery (DefaultProgressEvery when zero).
	Term          io.Writer
	ProgressEvery time.Duration
	Redact        *Redactor
	// mu keeps lines whole: progress (Progress, WorkProgress) comes from the goroutine
	// of the step that reports it, beside the engine's events.
	mu sync.Mutex
	// bars is the last progress of each resource at work, in the order they began;
	// drawn, how many lines their bars take on the terminal now.
	bars  []agent.Progress
	drawn int
	// lines says when progress is due as a line, without a terminal.
	lines ProgressLines
}

// printf prints a line of the view. Its arguments are values from the plan, the host
// and errors: their control characters are escaped (a newline as \n), so that a flag
// value, a log quote or an error cannot forge a line of the plan or move the terminal's
// cursor (issue 27). Only the format's own newlines end lines, and a Block's: an error
// and a Block (a log tail, a traceback) go on as indented lines behind a gutter, each
// escaped on its own (Block.String).
func (v *View) printf(format string, args ...any) {
	for i, a := range args {
		switch a := a.(type) {
		case Block:
			args[i] = a.String()
		case string:
			args[i] = Printable(a)
		case error:
			args[i] = Block{Text: a.Error(), Indent: 6}.String()
		case fmt.Stringer:
			args[i] = Printable(a.String())
		}
	}
	line := v.Redact.String(fmt.Sprintf(format, args...))
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.drawn == 0 {
		fmt.Fprint(v.W, line)
		return
	}
	// Bars are on the terminal: the line goes above them, and they below it again.
	fmt.Fprintf(v.Term, "\x1b[%dA\r\x1b[J", v.drawn)
	v.drawn = 0
	fmt.Fprint(v.W, line)
	v.redraw(nil)
}

// Block is multi-line text for people (a log tail, an error quoting a traceback): its
// first line goes where the format puts it, each further line on a line of its own,
// Indent spaces and a gutter ("│ ") in, so that no line of it can pass for a line of the
// view. Every line is escaped on its own (Printable): a control character in it stays
// quoted. --json keeps the string as it is.
type Block struct {
	Text   string
	Indent int
}

// gutter begins each further line of a Block.
const gutter = "│ "

// String is the block as the view prints it.
func (b Block) String() string {
	lines := strings.Split(strings.TrimRight(b.Text, "\n"), "\n")
	var out strings.Builder
	out.WriteString(Printable(strings.TrimSuffix(lines[0], "\r")))
	for _, l := range lines[1:] {
		out.WriteString("\n" + strings.Repeat(" ", b.Indent) + gutter)
		out.WriteString(Printable(strings.TrimSuffix(l, "\r")))
	}
	return out.String()
}

// Printable is s with its control characters escaped as Go writes them in a quoted
// string (\n, \t, \x1b, \u0085): what a person's terminal shows as one line, as it is.
func Printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r >= 0x7f && r < 0xa0 }) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r < 0x20 || r >= 0x7f && r < 0xa0 {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Progress prints where a long step of addr stands, between its start and done events
// ("  … server.qwen: stopping pid 4711, 10 s of 30 s, SIGTERM sent; 1 process left").
func (v *View) Progress(addr, what string) {
	v.printf("  … %s: %s\n", addr, what)
}

// Plan prints the diff of a plan run, terraform-style.
func (v *View) Plan(rep *agent.Report) {
	changed := 0
	for _, st := range rep.Steps {
		v.moved(st)
		if st.Err != nil {
			v.printf("  ! %s: %s\n", st.Addr, errLine(st.Addr, st.Err))
			continue
		}
		if st.Diff.Action == agent.NoOp {
			v.warnings(st)
			continue
		}
		changed++
		v.diff(st)
	}
	for _, r := range rep.Rollouts {
		if r.Disruptions.Total() > 0 {
			v.printf("  %s\n", r)
		}
	}
	s := rep.Summary()
	switch {
	case rep.Failed():
		v.printf("\nPlan incomplete: %d resources could not be observed.\n", countErrs(rep))
	case changed == 0:
		v.printf("No changes. The host matches the plan (%d resources).\n", len(rep.Steps))
	default:
		v.printf("\nPlan: %s.\n", s)
	}
}

func countErrs(rep *agent.Report) int {
	n := 0
	for _, st := range rep.Steps {
		if st.Err != nil {
			n++
		}
	}
	return n
}

// moved says that a moved block renames the resource (its record moves; nothing restarts).
func (v *View) moved(st *agent.Step) {
	if st.MovedFrom != "" {
		v.printf("  %s has moved to %s (its record moves; nothing restarts)\n", st.MovedFrom, st.Addr)
	}
}

func (v *View) warnings(st *agent.Step) {
	for _, w := range st.Diff.Warnings {
		v.printf("  ! %s: %s\n", st.Addr, w)
	}
}

// diff prints one resource's changes.
func (v *View) diff(st *agent.Step) {
	d := st.Diff
	v.printf("  %s %s (%s)\n", d.Action.Symbol(), st.Addr, d.Action)
	if len(st.DeletedAfter) > 0 && d.Action == agent.Delete {
		// What serves now was launched from it: the way back stays until the switch
		// is verified (issue 35).
		v.printf("      %s (what it serves now was launched from it)\n", agent.DeletedAfterText(st.DeletedAfter))
	}
	for _, c := range d.Changes {
		v.printf("      %s\n", changeLine(c))
		for _, l := range changeMore(c) {
			v.printf("            %s\n", l)
		}
		if c.Text != "" && !c.Sensitive {
			for _, line := range strings.Split(strings.TrimRight(c.Text, "\n"), "\n") {
				v.printf("          %s\n", line)
			}
		}
	}
	for _, w := range d.Warnings {
		v.printf("      ! %s\n", w)
	}
}

// changeMore is what a change shows below its line: a command line's flags, one per
// line (all of them when it appears, the ones that differ when it changes).
func changeMore(c agent.Change) []string {
	if c.Sensitive {
		return nil
	}
	o, oldCmd := c.Old.(agent.CommandLine)
	n, newCmd := c.New.(agent.CommandLine)
	switch {
	case c.HasOld && c.HasNew && oldCmd && newCmd:
		return commandLineDiff(o, n)
	case c.HasNew && !c.HasOld && newCmd:
		return commandLines(n)
	case c.HasOld && !c.HasNew && oldCmd:
		return commandLines(o)
	}
	return nil
}

func changeLine(c agent.Change) string {
	if !c.Sensitive && len(changeMore(c)) > 0 {
		// The lines below say it all; the head says what kind of change it is.
		sym := map[bool]string{true: "+", false: "~"}[!c.HasOld]
		if !c.HasNew {
			sym = "-"
		}
		line := sym + " " + c.Attr
		if note := noteOf(c); note != "" {
			line += "  (" + note + ")"
		}
		return line
	}
	sym := "~"
	switch {
	case c.HasNew && !c.HasOld:
		sym = "+"
	case c.HasOld && !c.HasNew:
		sym = "-"
	}
	old, new := agent.Render(c.Old), agent.Render(c.New)
	var val string
	switch {
	case c.Sensitive:
		// One word for both sides: "(sensitive) → (sensitive)" says nothing more, and
		// the symbol already says whether it is added, changed or removed.
		val = "(sensitive)"
	case c.HasOld && c.HasNew:
		val = old + " → " + new
	case c.HasNew:
		val = new
	case c.HasOld:
		val = old
	}
	line := sym + " " + c.Attr
	if val != "" {
		line += ": " + val
	}
	if note := noteOf(c); note != "" {
		line += "  (" + note + ")"
	}
	return strings.TrimRight(line, " ")
}

// noteOf is what the human view says after a change: the kind's note, else what its
// effect means when that is more than an in-place change.
func noteOf(c agent.Change) string {
	if c.Note != "" {
		return c.Note
	}
	switch c.EffectOf() {
	case agent.Restarts:
		return "restart"
	case agent.Replaces:
		return "forces replacement"
	case agent.Deletes:
		return c.Why().Describe()
	}
	return ""
}

// errLine is an error as shown after "  ✗ ADDR: ": without the address it already
// starts with, its further lines (a log's tail) indented below it.
func errLine(addr string, err error) Block {
	return Block{Text: strings.TrimPrefix(err.Error(), addr+": "), Indent: 6}
}

// ApplyEvent prints one apply event as it happens.
func (v *View) ApplyEvent(ev agent.Event) {
	st := ev.Step
	switch ev.Phase {
	case agent.PhaseStart:
		v.diff(st)
		v.printf("  … %s: %s\n", st.Addr, progressive(st.Diff.Action))
	case agent.PhaseDone:
		switch {
		case st.Err != nil:
			var re *agent.RolloutError
			if errors.As(st.Err, &re) {
				v.printf("  - %s: skipped: %s\n", st.Addr, re.Error())
			} else if cause, ok := st.Skipped(); ok {
				v.printf("  - %s: skipped, because %s failed\n", st.Addr, cause)
			} else {
				v.printf("  ✗ %s: %s\n", st.Addr, errLine(st.Addr, st.Err))
			}
		case st.Applied && st.Diff.Action == agent.Adopt:
			v.printf("  ✓ %s: adopted, no restart; verified (%s)\n", st.Addr, st.Duration.Round(time.Millisecond))
		case st.Applied:
			v.printf("  ✓ %s: %s and verified (%s)\n", st.Addr, past(st.Diff.Action), st.Duration.Round(time.Millisecond))
		}
	case agent.PhaseFinished:
		v.printf("  ✓ %s: finished and verified: %s\n", st.Addr, st.Finished)
	}
}

// ApplySummary prints the closing line of an apply.
func (v *View) ApplySummary(rep *agent.Report) { v.summary(rep, "Apply") }

// DestroySummary prints the closing line of agent destroy.
func (v *View) DestroySummary(rep *agent.Report) { v.summary(rep, "Destroy") }

func (v *View) summary(rep *agent.Report, verb string) {
	applied, failed, skipped := 0, 0, 0
	for _, st := range rep.Steps {
		switch {
		case st.Err != nil:
			if _, ok := st.Skipped(); ok {
				skipped++
			} else {
				failed++
			}
		case st.Applied:
			applied++
		}
		if st.Diff != nil && st.Err == nil {
			v.warnings(st)
		}
	}
	finished := 0
	for _, st := range rep.Steps {
		if st.Finished != "" {
			finished++
		}
	}
	switch {
	case failed > 0:
		v.printf("\n%s failed: %d changed, %d failed, %d skipped.\n", verb, applied, failed, skipped)
	case applied == 0 && finished > 0:
		v.printf("\n%s complete: %d finished (make before break), all verified; nothing else changed.\n", verb, finished)
	case applied == 0:
		v.printf("No changes. The host matches the plan (%d resources).\n", len(rep.Steps))
	default:
		v.printf("\n%s complete: %d changed, all verified; %d unchanged.\n", verb, applied, len(rep.Steps)-applied)
	}
}

func progressive(a agent.Action) string {
	switch a {
	case agent.Adopt:
		return "adopting"
	case agent.Create:
		return "creating"
	case agent.Update:
		return "updating"
	case agent.Restart:
		return "restarting"
	case agent.Replace:
		return "replacing"
	case agent.Delete:
		return "deleting"
	}
	return string(a)
}

func past(a agent.Action) string {
	switch a {
	case agent.Adopt:
		return "adopted"
	case agent.Create:
		return "created"
	case agent.Update:
		return "updated"
	case agent.Restart:
		return "restarted"
	case agent.Replace:
		return "replaced"
	case agent.Delete:
		return "deleted"
	}
	return string(a)
}

// Status prints live status: one line per resource, then its fields.
func (v *View) Status(rep *agent.Report) {
	for _, st := range rep.Steps {
		switch {
		case st.Err != nil:
			v.printf("  ✗ %s: %s\n", st.Addr, errLine(st.Addr, st.Err))
			continue
		case st.Status.Healthy:
			v.printf("  ✓ %s: %s\n", st.Addr, st.Status.Summary)
		default:
			v.printf("  ! %s: %s\n", st.Addr, st.Status.Summary)
		}
		width := 0
		for _, f := range st.Status.Fields {
			width = max(width, len(f.Name))
		}
		for _, f := range st.Status.Fields {
			v.printf("      %-*s  %s\n", width, f.Name, Block{Text: f.Text, Indent: 8 + width})
		}
	}
	v.members(rep)
}
