package view

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
)

// WorkProgress shows where a long step stands (agent.Progress: a download's bytes, rate
// and ETA). On a terminal (View.Term) it draws one bar per file in flight and a total,
// per resource at work, as one block redrawn in place below the report's lines (which
// it moves out of their way), and at the end of a resource's work replaces its bars with
// one line: what is in place, how long it took, at what rate. Elsewhere (a file, a pipe,
// the journal) it prints no escape code: a line on W every ProgressEvery of the work
// (ProgressLines), and the closing line if it printed one.
func (v *View) WorkProgress(p agent.Progress) {
	if v.Term == nil {
		if line, ok := v.lines.line(p, v.ProgressEvery); ok && p.Final {
			v.printf("  %s: %s\n", p.Addr, line)
		} else if ok {
			v.Progress(p.Addr, line)
		}
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	i := slices.IndexFunc(v.bars, func(b agent.Progress) bool { return b.Addr == p.Addr })
	if p.Final {
		if i >= 0 {
			v.bars = slices.Delete(v.bars, i, i+1)
		}
		v.redraw(func(b *strings.Builder) {
			if p.Done > 0 {
				fmt.Fprintf(b, "  %s: %s\n", p.Addr, inPlace(p))
			}
		})
		return
	}
	if i >= 0 {
		v.bars[i] = p
	} else {
		v.bars = append(v.bars, p)
	}
	v.redraw(nil)
}

const barWidth = 24

// redraw erases the block of bars, writes what above writes (a line that must stay on
// the terminal), and draws the block again, all in one write. v.mu is held.
func (v *View) redraw(above func(*strings.Builder)) {
	var b strings.Builder
	if v.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\r\x1b[J", v.drawn)
	}
	if above != nil {
		above(&b)
	}
	v.drawn = 0
	for _, p := range v.bars {
		v.drawn += drawBars(&b, p)
	}
	if b.Len() > 0 {
		fmt.Fprint(v.Term, v.Redact.String(b.String()))
	}
}

// drawBars writes one line per file of p in flight (at most 8) and its total line, and
// returns how many lines it wrote.
func drawBars(b *strings.Builder, p agent.Progress) int {
	lines := 0
	const maxShown = 8
	for i, f := range p.Files {
		if i == maxShown {
			fmt.Fprintf(b, "    … and %d more files\n", len(p.Files)-maxShown)
			lines++
			break
		}
		name := f.Name
		if len(name) > 40 {
			name = "…" + name[len(name)-39:]
		}
		verb := ""
		if f.Verifying {
			verb = " verifying"
		}
		fmt.Fprintf(b, "    %-40s %s %s%s\n", name, bar(f.Done, f.Total), amounts(f.Done, f.Total, f.Rate, f.ETA), verb)
		lines++
	}
	fmt.Fprintf(b, "  %-42s %s %s\n", p.Addr, bar(p.Done, p.Total), amounts(p.Done, p.Total, p.Rate, p.ETA))
	return lines + 1
}

func bar(done, total int64) string {
	if total <= 0 {
		return "[" + strings.Repeat("?", barWidth) + "]"
	}
	n := int(float64(barWidth) * float64(min(done, total)) / float64(total))
	return "[" + strings.Repeat("=", n) + strings.Repeat(" ", barWidth-n) + "]"
}

func amounts(done, total int64, rate float64, eta time.Duration) string {
	t := "?"
	if total >= 0 {
		t = bytesize.Format(total)
	}
	e := "?"
	if eta >= 0 {
		e = eta.Round(time.Second).String()
	}
	return fmt.Sprintf("%9s / %-9s %9s/s  ETA %s", bytesize.Format(done), t, bytesize.Format(int64(rate)), e)
}
