package lifecycle

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/agent-dev/agent/internal/engines"
)

// followChunk bounds what one LogFollower.Read scans: a log that grew by more since the
// last look is caught up over the next reads.
const followChunk = 16 << 20

// LogFollower reads one generation's growing log: each read scans only the lines
// appended since the last one (engines.Scanner), so that a log of a month costs a
// liveness probe or a status only what it grew by. A line counts once it is whole (its
// newline written). A log truncated or replaced by another file is read again from its
// beginning. It is safe for concurrent use (probes overlap, statuses run beside them).
type LogFollower struct {
	mu   sync.Mutex
	path string
	file os.FileInfo // the file read so far; nil before the first read
	off  int64
	seam []byte // the last bytes before off, as read: a log rewritten in place differs there
	part []byte // the unfinished last line
	long bool   // the unfinished line passed engines' line limit: skipped
	sc   *engines.Scanner
	now  func() time.Time // the year of vLLM's month-day times; time.Now but in tests
}

// FollowLog starts following the log at path from its beginning.
func FollowLog(path string) *LogFollower {
	f := &LogFollower{path: path, now: time.Now}
	f.restart()
	return f
}

func (f *LogFollower) restart() {
	f.file, f.off, f.seam, f.part, f.long = nil, 0, nil, nil, false
	f.sc = engines.NewScanner(time.Local, f.now())
}

// Read scans what the log grew by, up to followChunk (a liveness probe's share), and
// returns what the whole log shows so far, and the engine its lines come from (ok false
// while none said).
func (f *LogFollower) Read() (m engines.Metrics, d engines.Dialect, ok bool, err error) {
	return f.read(context.Background(), followChunk)
}

// ReadAll is Read to the end of the log, however much it grew by, until ctx ends.
func (f *LogFollower) ReadAll(ctx context.Context) (m engines.Metrics, d engines.Dialect, ok bool, err error) {
	return f.read(ctx, -1)
}

// read scans at most limit bytes (-1: to the end).
func (f *LogFollower) read(ctx context.Context, limit int64) (m engines.Metrics, d engines.Dialect, ok bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	file, err := os.Open(f.path)
	if err != nil {
		return m, "", false, err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return m, "", false, err
	}
	if f.file != nil && (!os.SameFile(f.file, st) || st.Size() < f.off || !f.seamHolds(file)) {
		f.restart() // truncated, replaced or rewritten: what it holds now is another text
	}
	f.file = st
	f.sc.SetNow(f.now())
	if _, err := file.Seek(f.off, io.SeekStart); err != nil {
		return m, "", false, err
	}
	buf := make([]byte, 64<<10)
	for read := int64(0); limit < 0 || read < limit; {
		if err := ctx.Err(); err != nil {
			return m, "", false, fmt.Errorf("scan server log: %w", err)
		}
		n, rerr := file.Read(buf)
		read += int64(n)
		f.off += int64(n)
		f.feed(buf[:n])
		f.seam = append(f.seam, buf[:n]...)
		f.seam = f.seam[max(0, len(f.seam)-seamLen):]
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return m, "", false, rerr
		}
	}
	d, ok = f.sc.Dialect()
	return f.sc.Metrics(), d, ok, nil
}

// seamLen is how many bytes before its offset a follower checks are still there.
const seamLen = 64

// seamHolds reports whether the bytes before the offset are those read there.
func (f *LogFollower) seamHolds(file *os.File) bool {
	if len(f.seam) == 0 {
		return true
	}
	b := make([]byte, len(f.seam))
	n, _ := file.ReadAt(b, f.off-int64(len(f.seam)))
	return bytes.Equal(b[:n], f.seam)
}

// feed splits data into lines, keeping an unfinished last one for the next read.
func (f *LogFollower) feed(data []byte) {
	const maxLine = 1 << 20 // as engines' scanner: longer lines (a tqdm bar) are skipped
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		chunk := data
		if i >= 0 {
			chunk = data[:i]
		}
		if !f.long {
			f.part = append(f.part, chunk...)
			if len(f.part) > maxLine {
				f.long, f.part = true, f.part[:0]
			}
		}
		if i < 0 {
			return
		}
		if !f.long {
			f.sc.Line(string(f.part))
		}
		f.part, f.long = f.part[:0], false
		data = data[i+1:]
	}
}

// ScanLog reads the serving state from one generation's log. The logs read lately each
// keep a LogFollower (logScans), so a status of a server up for a month reads what its
// log grew by since the last status, not the month's log again.
func ScanLog(ctx context.Context, path string) (engines.Metrics, error) {
	m, _, _, err := LogOf(path).ReadAll(ctx)
	return m, err
}

// LogOf is the follower of the log at path that ScanLog reads on, made on first use:
// a liveness watch reading it shares what a status read, and the other way round.
func LogOf(path string) *LogFollower { return logScans.follower(path) }

// logScanKeep is how many logs' followers ScanLog keeps: one per generation a status or
// an observation read lately; the least lately read goes first.
const logScanKeep = 64

var logScans = &followers{m: map[string]*kept{}}

type followers struct {
	mu sync.Mutex
	m  map[string]*kept
}

type kept struct {
	f    *LogFollower
	used time.Time
}

func (c *followers) follower(path string) *LogFollower {
	c.mu.Lock()
	defer c.mu.Unlock()
	if k, ok := c.m[path]; ok {
		k.used = time.Now()
		return k.f
	}
	if len(c.m) >= logScanKeep {
		var oldest string
		for p, k := range c.m {
			if oldest == "" || k.used.Before(c.m[oldest].used) {
				oldest = p
			}
		}
		delete(c.m, oldest)
	}
	k := &kept{f: FollowLog(path), used: time.Now()}
	c.m[path] = k
	return k.f
}
