package warm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-dev/agent/internal/bytesize"
)

// Defaults of Options.
const (
	DefaultReaders = 4
	DefaultBlock   = 16 << 20
	DefaultMargin  = 2 << 30
	// Share is the part of MemAvailable a warm-up may fill.
	Share = 0.9
)

// Options says how a warm-up reads and what memory it may take.
type Options struct {
	// Root is the host's root for /proc/meminfo ("" is /; AGENT_HOST_ROOT in tests).
	Root string
	// Margin is kept free besides the 10 % of MemAvailable (0: DefaultMargin; negative: none).
	Margin int64
	// Readers is how many files' ranges are read at once (0: DefaultReaders).
	Readers int
	// Block is the size of one read (0: DefaultBlock).
	Block int64
	// Progress, when set, hears after each read the bytes read so far and the bytes to
	// read in all; the readers call it at once, so it must be quick and safe for that.
	Progress func(read, need int64)
}

// Result is what a warm-up did.
type Result struct {
	Files          int     `json:"files"`
	Bytes          int64   `json:"bytes"`           // the files' total size
	ResidentBefore int64   `json:"resident_before"` // of Bytes, in the page cache before
	Read           int64   `json:"read"`            // bytes read into the page cache
	Seconds        float64 `json:"seconds"`
	// Skipped says why nothing was read although pages were missing ("" when it ran).
	Skipped string `json:"skipped,omitempty"`
	// IdleIO is false when the kernel refused the idle I/O class (the reads ran at
	// the default priority).
	IdleIO bool `json:"idle_io"`
}

// ErrTooLarge is the memory rule's refusal; Warm returns it with the Result's Skipped.
var ErrTooLarge = errors.New("weights do not fit in the page cache")

// span is one range of a file to read.
type span struct {
	file     int
	off, len int64
}

// Warm reads the pages of files that are not resident. It returns when every missing
// page was read, ctx ended (the error says so, with what was read) or a file failed.
// A warm-up the memory rule refuses reads nothing and returns ErrTooLarge.
func Warm(ctx context.Context, files []string, o Options) (Result, error) {
	start := time.Now()
	res := Result{Files: len(files)}
	done := func(err error) (Result, error) {
		res.Seconds = time.Since(start).Seconds()
		return res, err
	}
	fds := make([]*os.File, 0, len(files))
	defer func() {
		for _, f := range fds {
			f.Close()
		}
	}()
	var spans []span
	for i, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return done(fmt.Errorf("warm %s: %w", p, err))
		}
		fds = append(fds, f)
		size, missing, err := Missing(f)
		if err != nil {
			return done(fmt.Errorf("warm %s: %w", p, err))
		}
		res.Bytes += size
		res.ResidentBefore += size
		for _, m := range missing {
			res.ResidentBefore -= m[1]
			spans = append(spans, span{file: i, off: m[0], len: m[1]})
		}
	}
	need := res.Bytes - res.ResidentBefore
	if need == 0 {
		return done(nil)
	}
	if allow, why := allowance(o); need > allow {
		res.Skipped = fmt.Sprintf("%s to read, more than the %s allowed (%s)", bytesize.Format(need), bytesize.Format(max(allow, 0)), why)
		return done(fmt.Errorf("%w: %s", ErrTooLarge, res.Skipped))
	}
	read, idle, err := readSpans(ctx, fds, spans, o, need)
	res.Read, res.IdleIO = read, idle
	if ctx.Err() != nil && read < need {
		err = fmt.Errorf("warm-up ended after %s of %s: %w", bytesize.Format(read), bytesize.Format(need), context.Cause(ctx))
	}
	return done(err)
}

// allowance is how many bytes a warm-up may read, and the rule's figures for a refusal.
func allowance(o Options) (int64, string) {
	margin := o.Margin
	if margin == 0 {
		margin = DefaultMargin
	}
	margin = max(margin, 0)
	avail, err := MemAvailable(o.Root)
	if err != nil {
		return 0, err.Error()
	}
	return int64(Share*float64(avail)) - margin, fmt.Sprintf("90 %% of MemAvailable %s less the margin %s", bytesize.Format(avail), bytesize.Format(margin))
}

// readSpans reads spans with o.Readers readers, each span in o.Block reads.
func readSpans(ctx context.Context, fds []*os.File, spans []span, o Options, need int64) (read int64, idle bool, err error) {
	readers, block := o.Readers, o.Block
	if readers <= 0 {
		readers = DefaultReaders
	}
	if block <= 0 {
		block = DefaultBlock
	}
	work := make(chan span)
	var total atomic.Int64
	var idleAll atomic.Bool
	idleAll.Store(true)
	var wg sync.WaitGroup
	errs := make([]error, readers)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for r := 0; r < readers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, min(block, 1<<30))
			add := func(n int64) {
				if t := total.Add(n); o.Progress != nil {
					o.Progress(t, need)
				}
			}
			idle := onIdleThread(func() {
				for sp := range work {
					err := readSpan(ctx, fds[sp.file], sp, buf, add)
					if err != nil && errs[r] == nil {
						errs[r] = err
						cancel()
					}
				}
			})
			if !idle {
				idleAll.Store(false)
			}
		}()
	}
feed:
	for _, sp := range spans {
		select {
		case work <- sp:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	return total.Load(), idleAll.Load(), errors.Join(errs...)
}

// readSpan reads one span sequentially with buf-sized reads, telling add each read's
// bytes; a file that shrank under it ends the span early (nothing left to cache).
func readSpan(ctx context.Context, f *os.File, sp span, buf []byte, add func(int64)) error {
	for n := int64(0); n < sp.len; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		b := buf[:min(int64(len(buf)), sp.len-n)]
		m, err := f.ReadAt(b, sp.off+n)
		n += int64(m)
		add(int64(m))
		if m == 0 || err != nil {
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("warm %s: %w", f.Name(), err)
			}
			return nil
		}
	}
	return nil
}

// onIdleThread runs fn on a thread of its own in the idle I/O scheduling class, and
// reports whether the class was set. The thread's own class is put back before it is
// released to other goroutines; only when that fails is it left locked, so that it ends
// with the goroutine. Ending a thread is not free: a child forked from it with a parent
// death signal (the test harnesses' incusd and etcd) gets that signal when it ends, and
// incusd shut down under the tests of other packages when the readers' threads ended.
func onIdleThread(fn func()) (idle bool) {
	runtime.LockOSThread()
	was, getErr := ioPriority()
	idle = SetIdleIO() == nil
	fn()
	if !idle {
		runtime.UnlockOSThread()
		return false
	}
	if getErr == nil && setIOPriority(was) == nil {
		runtime.UnlockOSThread()
	}
	return true
}

// ioPriority is the calling thread's raw I/O priority (class and level).
func ioPriority() (int, error) {
	r, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("ioprio_get: %w", e)
	}
	return int(r), nil
}

// setIOPriority sets the calling thread's raw I/O priority.
func setIOPriority(prio int) error {
	if _, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, uintptr(prio)); e != 0 {
		return fmt.Errorf("ioprio_set: %w", e)
	}
	return nil
}

// SetIdleIO puts the calling thread in the idle I/O scheduling class.
func SetIdleIO() error {
	_, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, ioprioClassIdle<<ioprioClassShift)
	if e != 0 {
		return fmt.Errorf("ioprio_set: %w", e)
	}
	return nil
}

// IOClass is the calling thread's I/O scheduling class (3: idle).
func IOClass() (int, error) {
	r, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("ioprio_get: %w", e)
	}
	return int(r) >> ioprioClassShift, nil
}

// From linux/ioprio.h.
const (
	ioprioWhoProcess = 1
	ioprioClassIdle  = 3
	ioprioClassShift = 13
)
