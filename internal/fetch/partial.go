package fetch

import (
	"crypto/sha256"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// sidecar is .NAME.partial.json: where the partial file came from and a checkpoint of the
// sha256 state after exactly Offset bytes of it.
type sidecar struct {
	Version   int    `json:"version"`
	URL       string `json:"url"`
	ETag      string `json:"etag,omitempty"`
	Size      int64  `json:"size"` // expected total, -1 unknown
	SHA256    string `json:"sha256,omitempty"`
	From      string `json:"from,omitempty"` // the URL ETag belongs to (a mirror's); URL if empty
	Offset    int64  `json:"offset"`
	HashState []byte `json:"hash_state"`
}

const sidecarVersion = 1

// partialState is the state of one file's partial download during an attempt. The hash
// covers exactly the first off bytes of the partial file.
type partialState struct {
	h     hash.Hash
	off   int64  // bytes hashed (and written)
	ckOff int64  // offset of the last checkpoint written
	etag  string // ETag the bytes came with
	from  string // the URL etag belongs to
	size  int64  // expected total, -1 unknown
	fd    *os.File
}

func freshState(f File) *partialState {
	return &partialState{h: sha256.New(), size: f.Size}
}

// loadPartial returns the state to resume f from: the sidecar's checkpoint, with the partial
// file truncated to it, or a fresh state (partial and sidecar removed) when there is nothing
// trustworthy to resume.
func (r *run) loadPartial(f File) (*partialState, error) {
	l := layoutOf(f.Name)
	if st, ok := r.readCheckpoint(f); ok && st.off > 0 {
		pf, err := r.root.OpenFile(l.partial, os.O_RDWR, 0)
		if err == nil {
			err = pf.Truncate(st.off)
			pf.Close()
		}
		if err == nil {
			return st, nil
		}
	}
	if err := r.discardPartial(f); err != nil {
		return nil, err
	}
	return freshState(f), nil
}

// readCheckpoint returns the sidecar's state if it belongs to f and the partial file holds at
// least its offset.
func (r *run) readCheckpoint(f File) (*partialState, bool) {
	l := layoutOf(f.Name)
	data, err := r.root.ReadFile(l.sidecar)
	if err != nil {
		return nil, false
	}
	var sc sidecar
	if json.Unmarshal(data, &sc) != nil || sc.Version != sidecarVersion || sc.URL != f.URL ||
		sc.SHA256 != f.SHA256 || (f.Size >= 0 && sc.Size != f.Size) || sc.Offset < 0 ||
		(sc.Size >= 0 && sc.Offset > sc.Size) {
		return nil, false
	}
	fi, err := r.root.Lstat(l.partial)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < sc.Offset {
		return nil, false
	}
	h := sha256.New()
	if h.(encoding.BinaryUnmarshaler).UnmarshalBinary(sc.HashState) != nil {
		return nil, false
	}
	from := sc.From
	if from == "" {
		from = sc.URL
	}
	return &partialState{h: h, off: sc.Offset, ckOff: sc.Offset, etag: sc.ETag, size: sc.Size, from: from}, true
}

// resumableOffset is how many bytes of f a resume would keep.
func (r *run) resumableOffset(t *task) int64 {
	if st, ok := r.readCheckpoint(t.f); ok {
		return st.off
	}
	return partialBytes(r.root, t.f, 0)
}

// discardPartial removes f's partial file and sidecar.
func (r *run) discardPartial(f File) error {
	l := layoutOf(f.Name)
	for _, p := range []string{l.partial, l.sidecar, l.live} {
		if err := r.root.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	return nil
}

// checkpoint makes the partial file durable up to st.off and records the hash state there.
// It does nothing if the file does not hold exactly st.off bytes (a short write), so a
// sidecar never claims bytes that are not on disk.
func (r *run) checkpoint(f File, st *partialState) error {
	if st.fd == nil || st.off == st.ckOff {
		return nil
	}
	fi, err := st.fd.Stat()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if fi.Size() != st.off {
		return nil
	}
	if err := st.fd.Sync(); err != nil {
		return fmt.Errorf("checkpoint: sync partial file: %w", err)
	}
	state, err := st.h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	data, err := json.Marshal(sidecar{
		Version: sidecarVersion, URL: f.URL, ETag: st.etag, Size: st.size,
		SHA256: f.SHA256, From: st.from, Offset: st.off, HashState: state,
	})
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	// An old or a new sidecar are both valid after a crash, so the directory is not synced.
	if err := writeFileAtomic(r.root, layoutOf(f.Name).sidecar, data, 0o600, false); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	st.ckOff = st.off
	return nil
}

// hashBody wraps a GET response body: it feeds the sha256 as bytes stream in, counts them and
// checkpoints every Options.CheckpointEvery bytes. It refuses to be read until BeforeCopy has
// validated the response and armed it.
type hashBody struct {
	rc   io.ReadCloser
	r    *run
	t    *task
	st   *partialState
	last *lastByte
}

func (b *hashBody) Read(p []byte) (int, error) {
	if b.st == nil {
		return 0, errNotInstalled
	}
	// grab writes each read before the next one, so here the file holds st.off bytes.
	if b.st.off-b.st.ckOff >= b.r.opts.CheckpointEvery {
		if err := b.r.checkpoint(b.t.f, b.st); err != nil {
			return 0, err
		}
	}
	n, err := b.rc.Read(p)
	if b.st.size >= 0 && b.st.off+int64(n) > b.st.size {
		// More than the file's size: a broken or hostile server (with no Content-Length
		// to catch it earlier) must not fill the disk. Nothing of this read is kept.
		return 0, fmt.Errorf("%w: the server sends more than the %d bytes expected", ErrSize, b.st.size)
	}
	if n > 0 {
		b.st.h.Write(p[:n])
		b.st.off += int64(n)
		b.t.done.Store(b.st.off)
		b.t.recv.Add(int64(n))
		b.t.moved.Add(int64(n))
		b.last.touch()
	}
	return n, err
}

func (b *hashBody) Close() error { return b.rc.Close() }
