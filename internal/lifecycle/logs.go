package lifecycle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/internal/engines"
)

// LogPath is the log file of one generation: <dir>/<name>.<generation>.log.
func LogPath(dir, name string, generation int) string {
	return filepath.Join(dir, name+"."+strconv.Itoa(generation)+".log")
}

// CurrentLink is <dir>/<name>.log, the symlink to the current generation's log.
func CurrentLink(dir, name string) string { return filepath.Join(dir, name+".log") }

// generations lists the generation numbers that have a log file in dir, ascending.
func generations(dir, name string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return generationsOf(names, name), nil
}

// generationsOf picks the generation numbers out of a log directory's file names,
// ascending.
func generationsOf(names []string, name string) []int {
	var gens []int
	for _, n := range names {
		mid, ok := strings.CutPrefix(n, name+".")
		if !ok {
			continue
		}
		mid, ok = strings.CutSuffix(mid, ".log")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(mid); err == nil && n > 0 && strconv.Itoa(n) == mid {
			gens = append(gens, n)
		}
	}
	slices.Sort(gens)
	return gens
}

// NextGeneration is the generation of the next launch: one above both the recorded
// generation and every log file already in dir, so a lost state record never makes a
// launch reuse an old log.
func NextGeneration(dir, name string, recorded int) (int, error) {
	gens, err := generations(dir, name)
	if err != nil {
		return 0, fmt.Errorf("log dir: %w", err)
	}
	next := recorded + 1
	if len(gens) > 0 && gens[len(gens)-1] >= next {
		next = gens[len(gens)-1] + 1
	}
	return next, nil
}

// linkCurrent points <name>.log at generation's file, atomically (a new symlink renamed
// over the old one). A regular file in its place is an error: it is someone's log.
func linkCurrent(dir, name string, generation int) error {
	link := CurrentLink(dir, name)
	if st, err := os.Lstat(link); err == nil && st.Mode()&fs.ModeSymlink == 0 {
		return fmt.Errorf("%s exists and is not a symlink: move it aside (the agent keeps <name>.log as a link to the current generation's log)", link)
	}
	tmp := filepath.Join(dir, "."+name+".log.tmp"+strconv.Itoa(os.Getpid()))
	_ = os.Remove(tmp)
	if err := os.Symlink(filepath.Base(LogPath(dir, name, generation)), tmp); err != nil {
		return fmt.Errorf("link current log: %w", err)
	}
	if err := os.Rename(tmp, link); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("link current log: %w", err)
	}
	return nil
}

// pruneLogs removes the oldest generations' logs beyond keep, never current's.
func pruneLogs(dir, name string, keep, current int) error {
	if keep < 1 {
		keep = 1
	}
	gens, err := generations(dir, name)
	if err != nil {
		return err
	}
	var errs []error
	for i := 0; i < len(gens)-keep; i++ {
		if gens[i] == current {
			continue
		}
		if err := os.Remove(LogPath(dir, name, gens[i])); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// tailBytes bounds how much of a log's end Tail and Failure read.
const tailBytes = 256 << 10

// Tail returns the last n lines of the file at path (fewer when it has fewer).
func Tail(path string, n int) ([]string, error) {
	lines, err := lastLines(path, tailBytes)
	if err != nil {
		return nil, err
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, nil
}

// Excerpt returns the last n lines of the file at path for an error to quote. A run of
// consecutive lines that differ only in their leading "[timestamp]" counts as one: its
// last line, marked with the run's length. While a server loads, the agent's own
// readiness probes fill its access log with "GET /health ... 503" once a poll; without
// this, a readiness timeout would quote twenty of those and not what the server said.
func Excerpt(path string, n int) ([]string, error) {
	lines, err := lastLines(path, tailBytes)
	if err != nil {
		return nil, err
	}
	lines = collapseRepeats(lines)
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, nil
}

// collapseRepeats replaces each run of lines equal but for their timestamp with the
// run's last line, followed by "  (× N)".
func collapseRepeats(lines []string) []string {
	var out []string
	for i := 0; i < len(lines); {
		key := withoutTimestamp(lines[i])
		j := i + 1
		for j < len(lines) && withoutTimestamp(lines[j]) == key {
			j++
		}
		last := lines[j-1]
		if j-i > 1 {
			last += fmt.Sprintf("  (× %d)", j-i)
		}
		out = append(out, last)
		i = j
	}
	return out
}

// withoutTimestamp drops a leading "[...]" (SGLang's and uvicorn's timestamp, as in
// "[2026-05-09 09:22:05 TP0] ...") so that lines that differ only there compare equal.
// A bracket that holds a rank ("TP0") is kept in the key, so ranks stay apart.
func withoutTimestamp(line string) string {
	if !strings.HasPrefix(line, "[") {
		return line
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return line
	}
	fields := strings.Fields(line[1:end])
	if len(fields) < 2 || !isTimestamp(fields[0], fields[1]) {
		return line
	}
	return strings.Join(fields[2:], " ") + line[end:]
}

// isTimestamp reports a "YYYY-MM-DD HH:MM:SS" pair, the shape SGLang writes.
func isTimestamp(date, clock string) bool {
	digits := func(s, shape string) bool {
		if len(s) != len(shape) {
			return false
		}
		for i := range len(shape) {
			if shape[i] == '9' && (s[i] < '0' || s[i] > '9') || shape[i] != '9' && s[i] != shape[i] {
				return false
			}
		}
		return true
	}
	return digits(date, "9999-99-99") && (digits(clock, "99:99:99") || len(clock) > 8 && digits(clock[:8], "99:99:99"))
}

func lastLines(path string, limit int64) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := max(st.Size()-limit, 0)
	b, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return nil, err
	}
	if off > 0 { // drop the partial first line
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	s := strings.TrimRight(string(b), "\n")
	if s == "" {
		return nil, nil
	}
	return strings.Split(s, "\n"), nil
}

// Failure looks for a known failure in the end of the log at path, in the
// dialect of the engine that wrote it (SGLang, vLLM, llama.cpp: package engines).
func Failure(path string) (engines.Failure, bool) {
	lines, err := lastLines(path, tailBytes)
	if err != nil {
		return engines.Failure{}, false
	}
	return engines.DetectFailure(lines)
}

// lineWatch finds a line in a growing file, reading only what was appended.
type lineWatch struct {
	path  string
	want  string
	off   int64
	carry []byte
	found bool
}

func (w *lineWatch) seen() (bool, error) {
	if w.found || w.want == "" {
		return true, nil
	}
	f, err := os.Open(w.path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.Seek(w.off, io.SeekStart); err != nil {
		return false, err
	}
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	if err != nil {
		return false, err
	}
	w.off += int64(len(b))
	buf := append(w.carry, b...)
	if bytes.Contains(buf, []byte(w.want)) {
		w.found = true
		return true, nil
	}
	// keep what could be the start of the line across reads
	if k := len(w.want); len(buf) > k {
		buf = buf[len(buf)-k:]
	}
	w.carry = slices.Clone(buf)
	return false, nil
}
