package view

import (
	"fmt"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
)

// WorkProgress shows where a long step stands (agent.Progress: a download's bytes, rate
// and ETA). On a terminal (View.Term) it draws one bar per file in flight and a total,
// redrawn in place, and at the end erases them and prints one line: what is in place,
// how long it took, at what rate. Elsewhere (a file, a pipe, the journal) it prints no
// escape code: a line on W every ProgressEvery of the work (ProgressLines), and the
// closing line if it printed one.
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
	if v.bars == nil {
		v.bars = map[string]int{}
	}
	if p.Final {
		v.erase(p.Addr)
		if p.Done > 0 {
			fmt.Fprint(v.Term, v.Redact.String(fmt.Sprintf("  %s: %s\n", p.Addr, inPlace(p))))
		}
		return
	}
	v.draw(p)
}

const barWidth = 24

// draw redraws one line per file in flight and a total line in place. v.mu is held.
func (v *View) draw(p agent.Progress) {
	var b strings.Builder
	drawn := v.bars[p.Addr]
	if drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", drawn)
	}
	lines := 0
	const maxShown = 8
	for i, f := range p.Files {
		if i == maxShown {
			fmt.Fprintf(&b, "\r\x1b[2K    … and %d more files\n", len(p.Files)-maxShown)
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
		fmt.Fprintf(&b, "\r\x1b[2K    %-40s %s %s%s\n", name, bar(f.Done, f.Total), amounts(f.Done, f.Total, f.Rate, f.ETA), verb)
		lines++
	}
	fmt.Fprintf(&b, "\r\x1b[2K  %-42s %s %s\n", p.Addr, bar(p.Done, p.Total), amounts(p.Done, p.Total, p.Rate, p.ETA))
	lines++
	for i := lines; i < drawn; i++ {
		b.WriteString("\r\x1b[2K\n")
	}
	if drawn > lines {
		fmt.Fprintf(&b, "\x1b[%dA", drawn-lines)
	}
	v.bars[p.Addr] = lines
	fmt.Fprint(v.Term, v.Redact.String(b.String()))
}

// erase removes addr's bars. v.mu is held.
func (v *View) erase(addr string) {
	if v.bars[addr] == 0 {
		return
	}
	fmt.Fprintf(v.Term, "\x1b[%dA\r\x1b[J", v.bars[addr])
	delete(v.bars, addr)
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
