package fetch

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
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
