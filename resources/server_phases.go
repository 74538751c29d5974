package resources

import (
	"bufio"
	"io"
	"os"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/engines"
)

// phaseLogLimit bounds how much of a generation's log is read for its start phases: they
// are all near its beginning (a start logs a few thousand lines at most).
const phaseLogLimit = 8 << 20

// statusPhases adds the start phases of the recorded generation, read from its own log
// (weights loaded, KV cache allocated, CUDA graphs captured, ready: engines.StartPhases),
// each with the time it took since the phase before it (the first since the launch), so
// that a ten-minute start says where its time went.
func statusPhases(st *agent.Status, logPath string, rec *serverRecord, now time.Time) {
	if logPath == "" || rec.LaunchedAt.IsZero() {
		return
	}
	f, err := os.Open(logPath)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, phaseLogLimit))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	prev := rec.LaunchedAt.Truncate(time.Second) // log times have whole seconds
	for _, m := range engines.StartPhases(lines, time.Local, now) {
		d := max(m.At.Sub(prev), 0)
		prev = m.At
		words := strings.ReplaceAll(string(m.Phase), "_", " ")
		st.Fields = append(st.Fields, agent.DurationField("start_"+string(m.Phase)+"_seconds", "start: "+words, d))
	}
}
