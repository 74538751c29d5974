package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// span is the range one worker is fetching: [next, end), none of it written yet. It covers
// whole blocks from its second block on; a steal moves end down to a block boundary.
type span struct {
	next, end int64
	// reserved: the worker may be writing up to here now; a steal cuts above it.
	reserved int64
	sent     time.Time // when the current request left
	first    time.Time // when its first byte arrived (zero: none yet)
	got      int64     // bytes written since the first byte
}

// rate is the span's bytes per second since its first byte, 0 when unknown.
func (sp *span) rate(now time.Time) float64 {
	if sp.first.IsZero() {
		return 0
	}
	if d := now.Sub(sp.first).Seconds(); d > 0 {
		return float64(sp.got) / d
	}
	return 0
}

const (
	// stealLook: a span is judged on its rate once its bytes have run this long, or, with
	// no byte yet, once its request has waited twice as long (a slow first byte is not
	// a slow connection before then); a split must save at least this long. A rate over a
	// shorter time is noise on a loaded machine (a server or a client starved of CPU for
	// a moment), and each split costs a request and the bytes the victim had in flight.
	stealLook = time.Second
	// stealRatio: a span slower than the thief by this factor is split; between
	// connections of about the same speed a split would only cost a request.
	stealRatio = 2
)

// claim gives the worker a span from the lowest block that is neither complete nor held,
// running over the following untouched blocks up to a piece, or nil when every block is
// held or done.
func (rf *rangedFile) claim() *span {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	for i := range rf.blocks {
		if rf.held[i] || rf.written[i] >= rf.blockLen(i) {
			continue
		}
		start := int64(i)*rf.block + rf.written[i]
		j := i
		for rf.held[j] = true; j+1 < rf.blocks && int64(j+1-i)*rf.block < rf.span && !rf.held[j+1] && rf.written[j+1] == 0; j++ {
			rf.held[j+1] = true
		}
		sp := &span{next: start, end: min(int64(j+1)*rf.block, rf.sc.Size), reserved: start}
		rf.spans[sp] = true
		return sp
	}
	return nil
}

// steal splits the span of the slowest connection when it runs at less than half the
// thief's rate (the fastest span's when the thief has none yet) and the split would save a
// second or more: the thief takes the far part, sized so that both finish
// together at their rates, and the victim keeps at least the rest of the block it is
// writing. aria2c does the same for a connection that falls
// behind; without it one congested connection holds the whole file (and the hashed prefix)
// back. nil when no span is worth splitting.
func (rf *rangedFile) steal(thiefRate float64) *span {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	now := time.Now()
	if thiefRate <= 0 {
		for sp := range rf.spans {
			thiefRate = max(thiefRate, sp.rate(now))
		}
	}
	if thiefRate <= 0 {
		return nil
	}
	var victim *span
	var cut int64
	worst := 0.0
	for sp := range rf.spans {
		judged := (!sp.first.IsZero() && now.Sub(sp.first) >= stealLook) || (sp.first.IsZero() && now.Sub(sp.sent) >= 2*stealLook)
		rv := sp.rate(now)
		if sp.sent.IsZero() || !judged || rv*stealRatio >= thiefRate {
			continue
		}
		left := sp.end - sp.next
		if rv > 0 && float64(left)/rv-float64(left)/(rv+thiefRate) < stealLook.Seconds() {
			// Not worth a request and the bytes the victim has in flight past the
			// cut: on a fast link the tail is over sooner than a split would help.
			continue
		}
		// Victim and thief finish together: the victim keeps rv/(rv+rt) of the rest,
		// rounded up to a block, and at least the block it is writing.
		at := sp.next + int64(float64(left)*rv/(rv+thiefRate))
		at = max(at, sp.reserved+1, sp.next+1)
		at = (at + rf.block - 1) / rf.block * rf.block
		if at >= sp.end {
			continue
		}
		eta := float64(left) / max(rv, 1)
		if victim == nil || eta > worst {
			victim, cut, worst = sp, at, eta
		}
	}
	if victim == nil {
		return nil
	}
	sp := &span{next: cut, end: victim.end, reserved: cut}
	victim.end = cut
	rf.spans[sp] = true
	rf.stolen.Add(1)
	return sp
}

// release ends a worker's span: its blocks are free for another worker (those it did not
// complete, after an error, are claimed again from where they stopped).
func (rf *rangedFile) release(sp *span) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	delete(rf.spans, sp)
	for i := sp.next / rf.block; i*rf.block < sp.end; i++ {
		rf.held[i] = false
	}
}

// work is one range worker: it holds a connection slot of the Fetch and fetches spans until
// none is left to claim or worth stealing. A failed request is retried on the same span
// from where it stopped, re-resolving through the file's URL (a signed CDN URL may have
// expired); the budget of failures resets whenever bytes arrive.
func (rf *rangedFile) work(ctx context.Context) error {
	release, err := rf.r.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	budget := rf.r.budget(rf.t)
	buf := make([]byte, copyBufferSize)
	tries := 1
	var sinceCk int64 // bytes this worker received since its last checkpoint
	var rate float64  // this worker's rate on its last span
	for {
		sp := rf.claim()
		if sp == nil {
			sp = rf.steal(rate)
		}
		if sp == nil {
			return nil
		}
		for {
			before := rf.t.recv.Load()
			err := rf.fetchSpan(ctx, sp, buf, &sinceCk)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				rf.release(sp)
				return context.Cause(ctx)
			}
			// The next attempt re-resolves through the file's URL: a signed CDN URL
			// that failed may have expired.
			rf.signed.Store(nil)
			var re *restartError
			var pe *permanentError
			if errors.Is(err, errNoRanges) || errors.As(err, &re) || errors.As(err, &pe) || permanent(err) || isDiskFull(err) {
				rf.release(sp)
				return err
			}
			tries++
			rf.retries.Add(1)
			if err := budget.next(ctx, err, rf.t.recv.Load() > before, tries); err != nil {
				rf.release(sp)
				return err
			}
		}
		rf.mu.Lock()
		if r := sp.rate(time.Now()); r > 0 {
			rate = r
		}
		rf.mu.Unlock()
		rf.release(sp)
	}
}

// fetchSpan GETs what is missing of sp and writes it at its offset, up to sp.end, which a
// steal may move down meanwhile: then the answer is read only that far.
func (rf *rangedFile) fetchSpan(ctx context.Context, sp *span, buf []byte, sinceCk *int64) error {
	rf.mu.Lock()
	start, end := sp.next, sp.end-1
	etag := rf.etag
	sp.sent, sp.first, sp.got = time.Now(), time.Time{}, 0
	rf.mu.Unlock()
	if start > end {
		return nil
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	last := newLastByte()
	stopWatch := rf.r.watchStall(actx, cancel, last)
	defer stopWatch()

	resp, cached, done, err := rf.requestSpan(ctx, actx, start, end, etag)
	defer done()
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	cs, ce, err := rf.checkAnswer(resp, cached, start, end)
	if err != nil {
		return err
	}
	if stolen, err := rf.readAnswer(ctx, actx, sp, resp, cs, ce, buf, sinceCk, last); err != nil || stolen {
		return err // stolen: the rest belongs to the thief; this answer is dropped
	}
	rf.mu.Lock()
	more := sp.next < sp.end
	rf.mu.Unlock()
	if more {
		return rf.fetchSpan(ctx, sp, buf, sinceCk) // the server sent a shorter range: ask for the rest
	}
	return nil
}

// requestSpan is the answer for bytes start-end: the one that learned the size when its
// body starts there, else a GET of the range (at the signed URL a redirect gave, when
// one is cached: cached). done releases the answer that learned the size.
func (rf *rangedFile) requestSpan(ctx, actx context.Context, start, end int64, etag string) (resp *http.Response, cached *string, done func(), err error) {
	if first := rf.takeFirst(start); first != nil {
		// The answer that learned the size: its body is the start of this piece. The
		// stall watch of this attempt cancels its request.
		stop := context.AfterFunc(actx, func() { first.cancel(context.Cause(actx)) })
		return first.resp, nil, func() { first.cancel(nil); stop() }, nil
	}
	done = func() {}
	u := rf.t.src
	cached = rf.signed.Load()
	if cached != nil {
		u = *cached
	}
	req, err := http.NewRequestWithContext(actx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, done, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("User-Agent", "agent-fetch")
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end))
	if etag != "" && !strings.HasPrefix(etag, "W/") {
		req.Header.Set("If-Range", etag)
	}
	if resp, err = rf.hc.Do(req); err != nil {
		rf.signed.Store(nil)
		if cause := context.Cause(actx); errors.Is(cause, ErrStalled) && ctx.Err() == nil {
			return nil, nil, done, fmt.Errorf("%w: no data for %s", ErrStalled, rf.r.opts.StallTimeout)
		}
		return nil, nil, done, err
	}
	return resp, cached, done, nil
}

// checkAnswer checks that resp answers the range start-end of the file as laid out (its
// status, encoding, ETag, Content-Range, size) and returns the bytes it carries.
func (rf *rangedFile) checkAnswer(resp *http.Response, cached *string, start, end int64) (cs, ce int64, err error) {
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		rf.signed.Store(nil)
		se := statusErrorOf(resp, rf.t.src)
		if cached != nil {
			se.Redirected = true // the file's URL was not asked this time
		}
		return 0, 0, se
	}
	if final := resp.Request.URL.String(); final != rf.t.src {
		rf.signed.Store(&final)
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return 0, 0, fmt.Errorf("%w: server sent Content-Encoding %q though identity was asked for", ErrCompressed, ce)
	}
	// The first answer names the ETag of the layout; every later one must carry it (the
	// other connections' answers may have come in since this request left).
	got := resp.Header.Get("ETag")
	rf.mu.Lock()
	learned := rf.etag == "" && got != ""
	if learned {
		rf.etag = got
	}
	etag := rf.etag
	rf.mu.Unlock()
	if got != etag {
		return 0, 0, &restartError{reason: fmt.Sprintf("ETag changed from %s to %s", etag, got)}
	}
	if resp.StatusCode == http.StatusOK {
		return 0, 0, errNoRanges
	}
	cs, ce, total, err := parseContentRange(resp.Header.Get("Content-Range"))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %w", ErrBadResponse, err)
	}
	switch {
	case total != rf.sc.Size:
		return 0, 0, &restartError{reason: fmt.Sprintf("size changed from %d to %d", rf.sc.Size, total)}
	case cs != start || ce > end:
		return 0, 0, fmt.Errorf("%w: asked for bytes %d-%d, got Content-Range %q", ErrBadResponse, start, end, resp.Header.Get("Content-Range"))
	case resp.ContentLength >= 0 && resp.ContentLength != ce-cs+1:
		return 0, 0, fmt.Errorf("%w: Content-Length %d disagrees with Content-Range %q", ErrBadResponse, resp.ContentLength, resp.Header.Get("Content-Range"))
	}
	if learned {
		if err := rf.checkpoint(); err != nil {
			return 0, 0, err
		}
	}
	return cs, ce, nil
}

// readAnswer reads the range cs-ce of resp (which may end before the span does: the next
// request asks for the rest), writing each read at its offset before counting it, and no
// further than the span's end as it is at each write (a steal may have moved it: stolen).
func (rf *rangedFile) readAnswer(ctx, actx context.Context, sp *span, resp *http.Response, cs, ce int64, buf []byte, sinceCk *int64, last *lastByte) (stolen bool, err error) {
	off, want := cs, ce-cs+1
	body := io.LimitReader(resp.Body, want)
	for want > 0 {
		// Never read past this worker's next checkpoint (unless another worker's is being
		// synced): what a reboot can cost stays within about one checkpoint per range.
		limit := min(int64(len(buf)), want)
		if left := rf.r.opts.CheckpointEvery - *sinceCk; left > 0 {
			limit = min(limit, left)
		}
		n, rerr := body.Read(buf[:limit])
		if n > 0 {
			k, stolen := rf.reserve(sp, off, int64(n))
			if _, err := rf.fd.WriteAt(buf[:k], off); err != nil {
				return false, err
			}
			off += k
			want -= k
			last.touch()
			rf.wrote(sp, off, k)
			if stolen {
				return true, nil
			}
			if *sinceCk += k; *sinceCk >= rf.r.opts.CheckpointEvery {
				// While another worker's checkpoint syncs, keep streaming and try again
				// after the next read: waiting for it would stall this connection.
				done, err := rf.tryCheckpoint()
				if err != nil {
					return false, err
				}
				if done {
					*sinceCk = 0
				}
			}
		}
		if rerr == io.EOF && want > 0 {
			return false, fmt.Errorf("%w: the range ended %d bytes early", io.ErrUnexpectedEOF, want)
		}
		if rerr != nil && rerr != io.EOF {
			if cause := context.Cause(actx); errors.Is(cause, ErrStalled) && ctx.Err() == nil {
				return false, fmt.Errorf("%w: no data for %s", ErrStalled, rf.r.opts.StallTimeout)
			}
			return false, rerr
		}
	}
	return false, nil
}

// reserve says how many of n bytes read at off the span may write: all of them, or those
// below its end when a steal moved it (stolen: this answer is done with). It marks them
// reserved first, so a steal never cuts below a write in progress.
func (rf *rangedFile) reserve(sp *span, off, n int64) (int64, bool) {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if sp.first.IsZero() {
		sp.first = time.Now()
	}
	k := max(min(n, sp.end-off), 0)
	sp.reserved = off + k
	return k, off+k >= sp.end && k < n
}

// takeFirst hands over the answer that learned the file's size when it starts at start
// (piece 0 with nothing written yet), once.
func (rf *rangedFile) takeFirst(start int64) *probeResponse {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	first := rf.first
	if first == nil || start != 0 {
		return nil
	}
	rf.first = nil
	return first
}

// wrote records that the span's bytes up to off are written (n of them new), in memory and
// in the live record (one slot per block they touch), and wakes the hasher.
func (rf *rangedFile) wrote(sp *span, off, n int64) {
	if n <= 0 {
		return
	}
	rf.mu.Lock()
	sp.next, sp.got = off, sp.got+n
	lo, hi := int((off-n)/rf.block), int((off-1)/rf.block)
	for i := lo; i <= hi; i++ {
		rf.written[i] = min(rf.blockLen(i), off-int64(i)*rf.block)
	}
	rf.cond.Broadcast()
	rf.mu.Unlock()
	if rf.live != nil {
		for i := lo; i <= hi; i++ {
			rf.live.setPiece(i, min(rf.blockLen(i), off-int64(i)*rf.block))
		}
	}
	rf.t.done.Add(n)
	rf.t.recv.Add(n)
	rf.t.moved.Add(n)
}
