package fetch

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"strings"
)

// The live record (.NAME.partial.live) says, within one boot of the machine, how many bytes
// of each block (the sidecar's unit) are written: each range worker rewrites its block's
// 8-byte slot with one pwrite after each write of data, and the hasher its offset and
// state. Neither is synced:
// a SIGKILLed agent leaves its written bytes and these slots in the page cache, where the
// next agent of the same boot finds both, so nothing written is fetched again. A pwrite of
// a few bytes inside one page either happens or does not when the process dies, and a slot
// is written only after the data it counts, so a slot never claims a byte not written. After
// a reboot (another /proc/sys/kernel/random/boot_id) unsynced bytes may be gone: the record
// is ignored and the sidecar's durable checkpoints count instead.
//
// Layout, little-endian: [0,8) magic, [8,24) layout id, [24,64) boot id, [64,192) hash slot
// (offset int64, state length uint16, state, crc32 of the slot's bytes before it), then one
// int64 per block from 192.

const (
	liveMagic     = "AGLIVE01"
	liveHashAt    = 64
	liveHashSlot  = 128
	livePiecesAt  = liveHashAt + liveHashSlot
	bootIDPath    = "/proc/sys/kernel/random/boot_id"
	layoutIDBytes = 16
)

// bootID names this boot of the machine ("" when unknown: then no live record is trusted).
func bootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// liveRecord is an open live record.
type liveRecord struct {
	f *os.File
}

// encodeLiveHeader is the record's first 64 bytes.
func encodeLiveHeader(layoutID []byte, boot string) []byte {
	b := make([]byte, liveHashAt)
	copy(b, liveMagic)
	copy(b[8:24], layoutID)
	copy(b[24:64], boot)
	return b
}

// encodeHashSlot is the hash slot for a hash state after off bytes.
func encodeHashSlot(off int64, state []byte) []byte {
	b := make([]byte, liveHashSlot)
	binary.LittleEndian.PutUint64(b, uint64(off))
	binary.LittleEndian.PutUint16(b[8:], uint16(len(state)))
	n := copy(b[10:liveHashSlot-4], state)
	binary.LittleEndian.PutUint32(b[10+n:], crc32.ChecksumIEEE(b[:10+n]))
	return b
}

func (lr *liveRecord) setPiece(i int, written int64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(written))
	_, err := lr.f.WriteAt(b[:], livePiecesAt+8*int64(i))
	return err
}

func (lr *liveRecord) setHash(off int64, state []byte) error {
	_, err := lr.f.WriteAt(encodeHashSlot(off, state), liveHashAt)
	return err
}

func (lr *liveRecord) close() {
	if lr != nil && lr.f != nil {
		lr.f.Close()
	}
}

// liveState is what a live record of this boot says.
type liveState struct {
	written   []int64
	hashOff   int64 // -1: no usable hash slot
	hashState []byte
}

// readLive reads the live record at rel if it belongs to layoutID and this boot.
func (r *run) readLive(rel string, layoutID []byte, pieces int) (*liveState, bool) {
	boot := bootID()
	if boot == "" {
		return nil, false
	}
	f, err := r.root.Open(rel)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, livePiecesAt+8*int64(pieces)+1))
	if err != nil || len(data) != livePiecesAt+8*pieces {
		return nil, false
	}
	if !bytes.Equal(data[:liveHashAt], encodeLiveHeader(layoutID, boot)) {
		return nil, false
	}
	ls := &liveState{written: make([]int64, pieces), hashOff: -1}
	for i := range pieces {
		ls.written[i] = int64(binary.LittleEndian.Uint64(data[livePiecesAt+8*i:]))
	}
	slot := data[liveHashAt:livePiecesAt]
	n := int(binary.LittleEndian.Uint16(slot[8:]))
	if 10+n+4 <= liveHashSlot && binary.LittleEndian.Uint32(slot[10+n:]) == crc32.ChecksumIEEE(slot[:10+n]) {
		h := sha256.New()
		if h.(encoding.BinaryUnmarshaler).UnmarshalBinary(slot[10:10+n]) == nil {
			ls.hashOff = int64(binary.LittleEndian.Uint64(slot))
			ls.hashState = bytes.Clone(slot[10 : 10+n])
		}
	}
	return ls, true
}

// writeLive replaces the live record at rel with one of this boot holding written and the
// hash state, and opens it for the slot updates. It is renamed into place but not synced:
// it only ever speaks for this boot.
func (r *run) writeLive(rel string, layoutID []byte, written []int64, hashOff int64, hashState []byte) (*liveRecord, error) {
	boot := bootID()
	data := encodeLiveHeader(layoutID, boot)
	data = append(data, encodeHashSlot(hashOff, hashState)...)
	for _, w := range written {
		data = binary.LittleEndian.AppendUint64(data, uint64(w))
	}
	tmp := rel + tmpSuffix
	f, err := r.root.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		r.root.Remove(tmp)
		return nil, err
	}
	if err := r.root.Rename(tmp, rel); err != nil {
		f.Close()
		r.root.Remove(tmp)
		return nil, err
	}
	if boot == "" {
		// No boot id: the record will never be trusted, so it is not worth updating.
		f.Close()
		return nil, errors.New("no boot id")
	}
	return &liveRecord{f: f}, nil
}
