package fetch

import (
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
)

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
