package fetch

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Parallel ranges within one file. A file larger than one piece (its size given, or learned
// by learnSize) is cut into pieces (16–64 MiB, smaller for files under 128 MiB); up to
// Options.Connections range workers per file, within Options.MaxConnections for the whole
// Fetch, each take the lowest piece nobody holds and GET it with a Range request on its own
// connection, writing at the piece's offset of the partial file (pre-sized, sparse). A
// per-connection cap of a CDN (16 MiB/s is typical) then multiplies by the connections
// instead of limiting the file.
//
// Progress is counted in blocks (a sixteenth of a piece, 16 KiB to 1 MiB): a worker's
// request covers a span of blocks, and a worker with nothing left to take splits the span of
// a connection much slower than itself at a block boundary (steal), so one congested
// connection does not hold the file back.
//
// One hasher per file follows the contiguous prefix as the blocks fill it, reading the bytes
// just written back from the page cache (pieces are handed out in order, so the prefix stays
// within a few pieces of the workers and the data is still cached): sha256 runs while the
// file arrives and never over cold data, and the file is verified the moment its last block
// lands.
//
// Checkpoints: every Options.CheckpointEvery bytes a worker receives, the partial file is
// fsynced and the sidecar (.NAME.partial.json, version 2) records how many bytes of each
// block are durable and the hash state at a durable offset, so after a reboot each worker
// fetches at most one checkpoint again. Within one boot the live record (live.go) counts
// every byte written, so an agent killed with SIGKILL fetches nothing twice.
//
// grab is not used here: it transfers a file as one stream from a single offset, with no
// way to ask for a range with an end or to write at an offset. The single-stream path
// (transfer.go, on grab) still serves small files, Connections = 1, and servers that ignore
// ranges: a 200 to a range request falls back to it.

// rangedSidecar is the sidecar of a file fetched in pieces.
type rangedSidecar struct {
	Version    int     `json:"version"`
	URL        string  `json:"url"`
	ETag       string  `json:"etag,omitempty"`
	Size       int64   `json:"size"`
	SHA256     string  `json:"sha256,omitempty"`
	From       string  `json:"from,omitempty"` // the URL ETag belongs to (a mirror's); URL if empty
	Piece      int64   `json:"piece"`          // the unit Done counts: a block (a whole piece before work stealing)
	Layout     string  `json:"layout"`         // ties the live record to this layout
	Done       []int64 `json:"done"`           // durable bytes of each block, from its start
	HashOffset int64   `json:"hash_offset"`
	HashState  []byte  `json:"hash_state"`
}

const (
	rangedVersion = 2
	minPiece      = 16 << 20
	maxPiece      = 64 << 20
	minSharePiece = 1 << 20 // smaller files are not worth a request per connection
	hashChunk     = 1 << 20
)

// errNoRanges: the server answered a range request with the whole file.
var errNoRanges = errors.New("the server ignores byte ranges")

// pieceSize is the piece length for a file of size fetched over Connections connections:
// four pieces per connection (so the prefix the hasher follows keeps moving), between 16 and
// 64 MiB (so a CDN's time to first byte stays a small share of each request), but no more
// than a connection's share, so that a 64 MiB file still uses every connection.
func (r *run) pieceSize(size int64) int64 {
	if r.opts.PieceSize > 0 {
		return r.opts.PieceSize
	}
	conns := int64(r.opts.Connections)
	p := min(max(size/(4*conns), minPiece), maxPiece)
	return max(min(p, (size+conns-1)/conns), minSharePiece)
}

// blockSize is the unit a file's progress is counted in (the sidecar's Done, the live
// record's slots) and the finest cut of a work steal: a sixteenth of a piece, between 16
// KiB and 1 MiB, so that a connection robbed of its range keeps at most one block; but at
// most 8192 blocks per file (a 52 GB file counts 6.3 MiB blocks), so the sidecar written
// at each checkpoint stays small.
func blockSize(size, piece int64) int64 {
	const minBlock, maxBlock, maxBlocks = 16 << 10, 1 << 20, 8192
	b := min(max(piece/16, minBlock), maxBlock)
	if floor := (size + maxBlocks - 1) / maxBlocks; b < floor {
		b = (floor + minBlock - 1) / minBlock * minBlock
	}
	return max(min(b, piece), 1)
}

// useRanges says whether f is fetched in pieces: more than one connection is allowed, its
// size spans two pieces or more (or is unknown: it is learned first, see learnSize), and no
// single-stream checkpoint is waiting to be resumed.
func (r *run) useRanges(t *task) bool {
	if t.single || r.opts.Connections < 2 || (t.f.Size >= 0 && t.f.Size <= r.pieceSize(t.f.Size)) {
		return false
	}
	if st, ok := r.readCheckpoint(t.f); ok && st.off > 0 {
		return false
	}
	return true
}

// rangedFile is one file being fetched in pieces.
type rangedFile struct {
	r    *run
	t    *task
	l    layout
	fd   *os.File
	live *liveRecord
	hc   *http.Client
	ft   *fileTransport

	block  int64 // the unit the sidecar and the live record count
	blocks int
	span   int64 // bytes a worker asks for at once (a piece: pieceSize)

	mu        sync.Mutex
	cond      *sync.Cond // signals the hasher
	sc        rangedSidecar
	written   []int64 // bytes written of each block, from its start
	held      []bool  // a worker's span covers the block
	spans     map[*span]bool
	hashOff   int64  // bytes hashed
	hashState []byte // marshalled hash after hashOff bytes
	etag      string
	stopped   bool

	ckMu    sync.Mutex // one checkpoint at a time
	signed  atomic.Pointer[string]
	retries atomic.Int32 // requests retried, for FileResult.Attempts
	stolen  atomic.Int32 // spans split off a slower connection, for FileResult.Stolen

	// first is the open answer to the GET that learned the file's size (bytes from 0), for
	// the worker that takes piece 0; nil once taken or when the size was known or came from
	// a HEAD.
	first *probeResponse
}

func (rf *rangedFile) blockLen(i int) int64 {
	return min(rf.block, rf.sc.Size-int64(i)*rf.block)
}

// contiguous is how many bytes from the start are written. Call with mu held.
func (rf *rangedFile) contiguous() int64 {
	for i := int(rf.hashOff / rf.block); i < rf.blocks; i++ {
		if rf.written[i] < rf.blockLen(i) {
			return int64(i)*rf.block + rf.written[i]
		}
	}
	return rf.sc.Size
}

// downloadPieces runs downloadRanged until the file is in place: a file that changed
// (ETag, size) starts over, a wrong result is retried within the retry budget, and a server
// that ignores ranges returns errNoRanges with the partial file discarded and t marked for
// the single stream.
func (r *run) downloadPieces(ctx context.Context, t *task) error {
	restarts := 0
	budget := r.budget(t)
	for {
		err := r.downloadRanged(ctx, t)
		if err == nil || ctx.Err() != nil {
			return err
		}
		var re *restartError
		switch {
		case errors.Is(err, errNoRanges):
			if r.resumableOffset(t) > 0 {
				t.fr.Restarts++
			}
			if derr := r.discardPartial(t.f); derr != nil {
				return derr
			}
			t.single = true
			return errNoRanges
		case errors.As(err, &re) && t.mirror:
			return err // this mirror's copy is not the file: the next source keeps the bytes
		case errors.As(err, &re) && restarts <= r.opts.Retries:
			restarts++
			t.fr.Restarts++
			if derr := r.discardPartial(t.f); derr != nil {
				return derr
			}
		case errors.Is(err, ErrChecksum) || errors.Is(err, ErrSize):
			// verifyAndPlace discarded the partial file: the next round starts over.
			if err := budget.next(ctx, err, false, t.fr.Attempts); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// downloadRanged fetches t's file in pieces from where the sidecar and the live record
// leave it, verifies it and renames it into place.
func (r *run) downloadRanged(ctx context.Context, t *task) error {
	rf, err := r.openRanged(ctx, t)
	if err != nil {
		return err
	}
	defer rf.close()
	if t.fr.Attempts == 0 {
		t.fr.ResumedFrom = rf.doneBytes()
	}
	t.fr.Attempts++
	t.done.Store(rf.doneBytes())
	t.total.Store(rf.sc.Size)

	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var hashErr error
	var hashSum []byte
	var hwg sync.WaitGroup
	hwg.Go(func() {
		hashSum, hashErr = rf.hash(fctx)
		if hashErr != nil {
			cancel(hashErr)
		}
	})
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	workers := int(min(int64(r.opts.Connections), (rf.sc.Size+rf.span-1)/rf.span))
	for range workers {
		wg.Go(func() {
			if err := rf.work(fctx); err != nil {
				once.Do(func() { firstErr = err })
				cancel(err)
			}
		})
	}
	wg.Wait()
	t.fr.Attempts += int(rf.retries.Load())
	t.fr.Stolen += int(rf.stolen.Load())
	rf.mu.Lock()
	rf.stopped = true
	rf.cond.Broadcast()
	rf.mu.Unlock()
	hwg.Wait()
	ckErr := rf.checkpoint()
	if firstErr == nil && hashErr != nil {
		firstErr = hashErr
	}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		if isDiskFull(firstErr) {
			return &permanentError{fmt.Errorf("%w: %w; %s keeps %d bytes for a resume", ErrDiskFull, firstErr, rf.l.partial, rf.doneBytes())}
		}
		return firstErr
	}
	if ckErr != nil {
		return ckErr
	}
	if hashSum == nil {
		return fmt.Errorf("internal error: pieces done but the hash stopped at %d of %d bytes", rf.hashOff, rf.sc.Size)
	}
	rf.fd.Close()
	rf.fd = nil
	t.setState(FileVerifying)
	return r.verifyAndPlace(t, hex.EncodeToString(hashSum), rf.sc.Size)
}

func (rf *rangedFile) close() {
	if rf.fd != nil {
		rf.fd.Close()
	}
	rf.live.close()
	rf.mu.Lock()
	first := rf.first
	rf.first = nil
	rf.mu.Unlock()
	first.close()
}

func (rf *rangedFile) doneBytes() int64 {
	rf.mu.Lock()
	defer rf.mu.Unlock()
	var n int64
	for _, w := range rf.written {
		n += w
	}
	return n
}

// openRanged resumes the file's pieces from the sidecar (and, in the same boot, the live
// record), or lays out a fresh partial file, learning its size first when the plan gives none.
func (r *run) openRanged(ctx context.Context, t *task) (_ *rangedFile, err error) {
	rf := &rangedFile{r: r, t: t, l: layoutOf(t.f.Name), spans: map[*span]bool{}}
	defer func() {
		if err != nil {
			rf.first.close()
		}
	}()
	rf.cond = sync.NewCond(&rf.mu)
	rf.hc, rf.ft = r.rangeClient(t)
	if sc, ok := r.readRangedSidecar(t.f); ok {
		rf.sc = *sc
		rf.block, rf.blocks = sc.Piece, len(sc.Done)
		rf.written = append([]int64(nil), sc.Done...)
		rf.hashOff, rf.hashState, rf.etag = sc.HashOffset, sc.HashState, sc.ETag
		if from := cmp.Or(sc.From, sc.URL); from != t.src {
			// Bytes of another source: kept (the hash judges them), but its ETag says
			// nothing about this one.
			rf.etag, rf.sc.ETag, rf.sc.From = "", "", t.src
		}
		layoutID, _ := hex.DecodeString(sc.Layout)
		if ls, ok := r.readLive(rf.l.live, layoutID, rf.blocks); ok {
			for i, w := range ls.written {
				rf.written[i] = max(rf.written[i], min(w, rf.blockLen(i)))
			}
			if ls.hashOff > rf.hashOff && ls.hashOff <= rf.contiguous() {
				rf.hashOff, rf.hashState = ls.hashOff, ls.hashState
			}
		}
		fd, err := r.root.OpenFile(rf.l.partial, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open partial file: %w", err)
		}
		rf.fd = fd
		live, err := r.writeLive(rf.l.live, layoutID, rf.written, rf.hashOff, rf.hashState)
		if err == nil {
			rf.live = live
		}
		rf.held = make([]bool, rf.blocks)
		rf.span = max(r.pieceSize(rf.sc.Size), rf.block)
		return rf, nil
	}
	if err := r.discardPartial(t.f); err != nil {
		return nil, err
	}
	size := t.f.Size
	if size < 0 {
		if size, rf.first, err = r.learnSize(ctx, t, rf.hc); err != nil {
			return nil, err
		}
		t.total.Store(size)
		if err := r.checkFree(size); err != nil {
			return nil, &permanentError{err}
		}
		if size == 0 || (rf.first == nil && size <= r.pieceSize(size)) {
			// Nothing to share between connections: one stream, as a file of this size
			// declared in the plan would be.
			t.single = true
			return nil, errNoRanges
		}
	}
	rf.span = r.pieceSize(size)
	rf.block = blockSize(size, rf.span)
	rf.blocks = int((size + rf.block - 1) / rf.block)
	rf.written = make([]int64, rf.blocks)
	rf.held = make([]bool, rf.blocks)
	state, _ := sha256.New().(encoding.BinaryMarshaler).MarshalBinary()
	rf.hashState = state
	layoutID := make([]byte, layoutIDBytes)
	rand.Read(layoutID)
	rf.sc = rangedSidecar{Version: rangedVersion, URL: t.f.URL, From: t.src, Size: size, SHA256: t.f.SHA256,
		Piece: rf.block, Layout: hex.EncodeToString(layoutID), Done: make([]int64, rf.blocks), HashState: state}
	// The sidecar first: a partial file sized in full is never seen (by Check, by status)
	// without the sidecar that says none of it is written yet.
	if err := rf.saveSidecar(true); err != nil {
		return nil, err
	}
	fd, err := r.root.OpenFile(rf.l.partial, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create partial file: %w", err)
	}
	rf.fd = fd
	if err := fd.Truncate(size); err != nil {
		return nil, fmt.Errorf("size partial file: %w", err)
	}
	if live, err := r.writeLive(rf.l.live, layoutID, rf.written, 0, state); err == nil {
		rf.live = live
	}
	return rf, nil
}

// readRangedSidecar returns f's version-2 sidecar if it belongs to f and its partial file.
func (r *run) readRangedSidecar(f File) (*rangedSidecar, bool) {
	l := layoutOf(f.Name)
	data, err := r.root.ReadFile(l.sidecar)
	if err != nil {
		return nil, false
	}
	sc, ok := parseRangedSidecar(data, f)
	if !ok {
		return nil, false
	}
	fi, err := r.root.Lstat(l.partial)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != sc.Size {
		return nil, false
	}
	return sc, true
}

func parseRangedSidecar(data []byte, f File) (*rangedSidecar, bool) {
	var sc rangedSidecar
	if json.Unmarshal(data, &sc) != nil || sc.Version != rangedVersion || sc.URL != f.URL || sc.SHA256 != f.SHA256 ||
		sc.Size < 0 || (f.Size >= 0 && sc.Size != f.Size) || sc.Piece <= 0 {
		return nil, false
	}
	if int64(len(sc.Done)) != (sc.Size+sc.Piece-1)/sc.Piece {
		return nil, false
	}
	contiguous, gap := int64(0), false
	for i, d := range sc.Done {
		if d < 0 || d > min(sc.Piece, sc.Size-int64(i)*sc.Piece) {
			return nil, false
		}
		if !gap {
			contiguous += d
			gap = d < min(sc.Piece, sc.Size-int64(i)*sc.Piece)
		}
	}
	if sc.HashOffset < 0 || sc.HashOffset > contiguous {
		return nil, false
	}
	if id, err := hex.DecodeString(sc.Layout); err != nil || len(id) != layoutIDBytes {
		return nil, false
	}
	if sha256.New().(encoding.BinaryUnmarshaler).UnmarshalBinary(sc.HashState) != nil {
		return nil, false
	}
	return &sc, true
}

// partialBytes is how much of f's partial file holds data: a ranged partial file is sized in
// full from the start, so its sidecar (and, this boot, its live record) says.
func partialBytes(root *os.Root, f File, size int64) int64 {
	l := layoutOf(f.Name)
	data, err := root.ReadFile(l.sidecar)
	if err != nil {
		return size
	}
	sc, ok := parseRangedSidecar(data, f)
	if !ok {
		return size
	}
	var n int64
	for _, d := range sc.Done {
		n += d
	}
	r := &run{root: root}
	id, _ := hex.DecodeString(sc.Layout)
	if ls, ok := r.readLive(l.live, id, len(sc.Done)); ok {
		var m int64
		for i, w := range ls.written {
			m += max(sc.Done[i], min(w, min(sc.Piece, sc.Size-int64(i)*sc.Piece)))
		}
		n = m
	}
	return n
}

// saveSidecar writes the sidecar from rf.sc (the directory synced for a new layout, so
// that it is found after a reboot).
func (rf *rangedFile) saveSidecar(syncDir bool) error {
	data, err := json.Marshal(rf.sc)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(rf.r.root, rf.l.sidecar, data, 0o600, syncDir); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// tryCheckpoint checkpoints unless a checkpoint is already running; it reports whether it did.
func (rf *rangedFile) tryCheckpoint() (bool, error) {
	if !rf.ckMu.TryLock() {
		return false, nil
	}
	defer rf.ckMu.Unlock()
	return true, rf.checkpointLocked()
}

// checkpoint makes every byte written so far durable and records it: the pieces' written
// counts and the hash state are taken first, then the file is fsynced, then the sidecar is
// replaced, so the sidecar never claims a byte that is not on disk.
func (rf *rangedFile) checkpoint() error {
	rf.ckMu.Lock()
	defer rf.ckMu.Unlock()
	return rf.checkpointLocked()
}

func (rf *rangedFile) checkpointLocked() error {
	if rf.fd == nil {
		return nil
	}
	rf.mu.Lock()
	done := append([]int64(nil), rf.written...)
	hashOff, hashState, etag := rf.hashOff, rf.hashState, rf.etag
	rf.mu.Unlock()
	if err := rf.fd.Sync(); err != nil {
		return fmt.Errorf("checkpoint: sync partial file: %w", err)
	}
	rf.mu.Lock()
	rf.sc.Done, rf.sc.HashOffset, rf.sc.HashState, rf.sc.ETag = done, hashOff, hashState, etag
	rf.mu.Unlock()
	return rf.saveSidecar(false)
}

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

	var cached *string
	var resp *http.Response
	if first := rf.takeFirst(start); first != nil {
		// The answer that learned the size: its body is the start of this piece. The
		// stall watch of this attempt cancels its request.
		stop := context.AfterFunc(actx, func() { first.cancel(context.Cause(actx)) })
		defer stop()
		defer first.cancel(nil)
		resp = first.resp
	} else {
		u := rf.t.src
		cached = rf.signed.Load()
		if cached != nil {
			u = *cached
		}
		req, err := http.NewRequestWithContext(actx, http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("request: %w", err)
		}
		req.Header.Set("User-Agent", "agent-fetch")
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end))
		if etag != "" && !strings.HasPrefix(etag, "W/") {
			req.Header.Set("If-Range", etag)
		}
		if resp, err = rf.hc.Do(req); err != nil {
			rf.signed.Store(nil)
			if cause := context.Cause(actx); errors.Is(cause, ErrStalled) && ctx.Err() == nil {
				return fmt.Errorf("%w: no data for %s", ErrStalled, rf.r.opts.StallTimeout)
			}
			return err
		}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
		rf.signed.Store(nil)
		se := statusErrorOf(resp, rf.t.src)
		if cached != nil {
			se.Redirected = true // the file's URL was not asked this time
		}
		return se
	}
	if final := resp.Request.URL.String(); final != rf.t.src {
		rf.signed.Store(&final)
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return fmt.Errorf("%w: server sent Content-Encoding %q though identity was asked for", ErrCompressed, ce)
	}
	// The first answer names the ETag of the layout; every later one must carry it (the
	// other connections' answers may have come in since this request left).
	got := resp.Header.Get("ETag")
	rf.mu.Lock()
	learned := rf.etag == "" && got != ""
	if learned {
		rf.etag = got
	}
	etag = rf.etag
	rf.mu.Unlock()
	if got != etag {
		return &restartError{reason: fmt.Sprintf("ETag changed from %s to %s", etag, got)}
	}
	if resp.StatusCode == http.StatusOK {
		return errNoRanges
	}
	cs, ce, total, err := parseContentRange(resp.Header.Get("Content-Range"))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadResponse, err)
	}
	switch {
	case total != rf.sc.Size:
		return &restartError{reason: fmt.Sprintf("size changed from %d to %d", rf.sc.Size, total)}
	case cs != start || ce > end:
		return fmt.Errorf("%w: asked for bytes %d-%d, got Content-Range %q", ErrBadResponse, start, end, resp.Header.Get("Content-Range"))
	case resp.ContentLength >= 0 && resp.ContentLength != ce-cs+1:
		return fmt.Errorf("%w: Content-Length %d disagrees with Content-Range %q", ErrBadResponse, resp.ContentLength, resp.Header.Get("Content-Range"))
	}
	if learned {
		if err := rf.checkpoint(); err != nil {
			return err
		}
	}
	// Read the range (which may end before the span does: the next request asks for the
	// rest), writing each read at its offset before counting it, and no further than the
	// span's end as it is at each write (a steal may have moved it).
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
				return err
			}
			off += k
			want -= k
			last.touch()
			rf.wrote(sp, off, k)
			if stolen {
				return nil // the rest belongs to the thief; this answer is dropped
			}
			if *sinceCk += k; *sinceCk >= rf.r.opts.CheckpointEvery {
				// While another worker's checkpoint syncs, keep streaming and try again
				// after the next read: waiting for it would stall this connection.
				done, err := rf.tryCheckpoint()
				if err != nil {
					return err
				}
				if done {
					*sinceCk = 0
				}
			}
		}
		if rerr == io.EOF && want > 0 {
			return fmt.Errorf("%w: the range ended %d bytes early", io.ErrUnexpectedEOF, want)
		}
		if rerr != nil && rerr != io.EOF {
			if cause := context.Cause(actx); errors.Is(cause, ErrStalled) && ctx.Err() == nil {
				return fmt.Errorf("%w: no data for %s", ErrStalled, rf.r.opts.StallTimeout)
			}
			return rerr
		}
	}
	rf.mu.Lock()
	more := sp.next < sp.end
	rf.mu.Unlock()
	if more {
		return rf.fetchSpan(ctx, sp, buf, sinceCk) // the server sent a shorter range: ask for the rest
	}
	return nil
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

// hash feeds the sha256 with the contiguous prefix as it fills, reading it back from the
// page cache right after it was written; it returns the digest once the whole file is
// hashed, or nil when the workers stopped first.
func (rf *rangedFile) hash(ctx context.Context) ([]byte, error) {
	h := sha256.New()
	rf.mu.Lock()
	state, off := rf.hashState, rf.hashOff
	rf.mu.Unlock()
	if err := h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
		return nil, err
	}
	buf := make([]byte, hashChunk)
	for {
		rf.mu.Lock()
		for rf.contiguous() == off && off < rf.sc.Size && !rf.stopped && ctx.Err() == nil {
			rf.cond.Wait()
		}
		upto := rf.contiguous()
		stopped := rf.stopped
		rf.mu.Unlock()
		if off == rf.sc.Size {
			return h.Sum(nil), nil
		}
		if upto == off {
			if stopped || ctx.Err() != nil {
				return nil, nil
			}
			continue
		}
		if err := rf.hashRange(h, buf, &off, upto); err != nil {
			return nil, fmt.Errorf("hash partial file: %w", err)
		}
	}
}

// hashRange hashes [*off, upto) of the partial file, recording the state after each chunk.
func (rf *rangedFile) hashRange(h hash.Hash, buf []byte, off *int64, upto int64) error {
	for *off < upto {
		n, err := rf.fd.ReadAt(buf[:min(int64(len(buf)), upto-*off)], *off)
		if n > 0 {
			h.Write(buf[:n])
			*off += int64(n)
			state, _ := h.(encoding.BinaryMarshaler).MarshalBinary()
			rf.mu.Lock()
			rf.hashOff, rf.hashState = *off, state
			rf.mu.Unlock()
			if rf.live != nil {
				rf.live.setHash(*off, state)
			}
		}
		if err != nil && !(err == io.EOF && *off == upto) {
			return err
		}
	}
	return nil
}

// rangeClient is the client of a file's range workers: the caller's client with its
// transport wrapped for identity encoding and per-origin headers, and its redirects checked.
func (r *run) rangeClient(t *task) (*http.Client, *fileTransport) {
	c := *r.client
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	u, _ := url.Parse(t.f.URL) // validated before
	ft := &fileTransport{base: base, origin: origin(u), header: t.f.Header, r: r, t: t, last: newLastByte(), plain: true}
	c.Transport = ft
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return checkURL(req.URL, r.opts.Insecure || t.mirror)
	}
	return &c, ft
}

// acquire takes one of the Fetch's connection slots (Options.MaxConnections).
func (r *run) acquire(ctx context.Context) (func(), error) {
	select {
	case r.slots <- struct{}{}:
		return func() { <-r.slots }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// probeResponse is an open answer to a ranged GET from byte 0, with the cancel of its
// request (which outlives the function that sent it).
type probeResponse struct {
	resp   *http.Response
	cancel context.CancelCauseFunc
}

func (p *probeResponse) close() {
	if p != nil {
		p.resp.Body.Close()
		p.cancel(nil)
	}
}

// learnSize finds the size of a file the plan gives none, as aria2c does: from a HEAD, or,
// when the server refuses HEAD or answers it without a length (both exist: object stores,
// proxies, chunked HEAD answers), from the Content-Range total of a first ranged GET, whose
// answer is returned open so that its bytes become the start of piece 0 rather than a
// request wasted. Either way every later answer is checked against the size learned here
// (fetchPiece): a changed total restarts the file, and the restart learns it again.
// errNoRanges means one stream: the server answered the GET with the whole file, or the
// file is empty.
func (r *run) learnSize(ctx context.Context, t *task, hc *http.Client) (int64, *probeResponse, error) {
	if size, ok := r.headSize(ctx, t, hc); ok {
		return size, nil, nil
	}
	budget := r.budget(t)
	for tries := 1; ; tries++ {
		size, first, err := r.probeSize(ctx, t, hc)
		if err == nil || ctx.Err() != nil || errors.Is(err, errNoRanges) || permanent(err) {
			return size, first, err
		}
		t.fr.Attempts++
		if err := budget.next(ctx, err, false, tries); err != nil {
			return 0, nil, err
		}
	}
}

// headSize asks HEAD for the file's length; ok is false when the answer gives none (any
// failure included: the ranged GET that follows says what is wrong, in its own words).
func (r *run) headSize(ctx context.Context, t *task, hc *http.Client) (int64, bool) {
	hctx, cancel := context.WithTimeout(ctx, r.opts.StallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodHead, t.src, nil)
	if err != nil {
		return 0, false
	}
	req.Header.Set("User-Agent", "agent-fetch")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	resp.Body.Close()
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return 0, false // the length of another encoding
	}
	if resp.StatusCode != http.StatusOK || resp.ContentLength < 0 {
		return 0, false
	}
	return resp.ContentLength, true
}

// probeSize sends the first ranged GET (bytes 0 to one share of a piece) and reads the
// file's size from its Content-Range.
func (r *run) probeSize(ctx context.Context, t *task, hc *http.Client) (int64, *probeResponse, error) {
	want := int64(minSharePiece)
	if r.opts.PieceSize > 0 {
		want = min(want, r.opts.PieceSize)
	}
	pctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, t.src, nil)
	if err != nil {
		cancel(nil)
		return 0, nil, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("User-Agent", "agent-fetch")
	req.Header.Set("Range", fmt.Sprintf("bytes=0-%d", want-1))
	stopWatch := r.watchStall(pctx, cancel, newLastByte())
	resp, err := hc.Do(req)
	stopWatch()
	if err != nil {
		cancel(nil)
		if errors.Is(context.Cause(pctx), ErrStalled) && ctx.Err() == nil {
			return 0, nil, fmt.Errorf("%w: no answer for %s", ErrStalled, r.opts.StallTimeout)
		}
		return 0, nil, err
	}
	fail := func(err error) (int64, *probeResponse, error) {
		resp.Body.Close()
		cancel(nil)
		return 0, nil, err
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
	case http.StatusOK:
		return fail(errNoRanges)
	case http.StatusRequestedRangeNotSatisfiable:
		// "bytes */0": an empty file has no byte 0.
		if v := resp.Header.Get("Content-Range"); v == "bytes */0" {
			return fail(errNoRanges)
		}
		return fail(statusErrorOf(resp, t.src))
	default:
		return fail(statusErrorOf(resp, t.src))
	}
	cs, _, total, err := parseContentRange(resp.Header.Get("Content-Range"))
	switch {
	case err != nil:
		return fail(fmt.Errorf("%w: %w", ErrBadResponse, err))
	case cs != 0:
		return fail(fmt.Errorf("%w: asked for bytes from 0, got Content-Range %q", ErrBadResponse, resp.Header.Get("Content-Range")))
	case total < 0:
		return fail(errNoRanges) // "bytes 0-N/*": the size stays unknown, one stream
	}
	return total, &probeResponse{resp: resp, cancel: cancel}, nil
}
