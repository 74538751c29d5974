package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The load mode (FAKE_SGLANG=load) reads the checkpoint as SGLang's default loader does:
// safetensors_weights_iterator opens each shard with safe_open (an mmap) and takes
// `for name in f.keys(): f.get_tensor(name)`, keys sorted by name, so the pages of a
// shard are faulted in tensor by tensor; *.bin and *.pt go through torch.load, which
// reads the whole file. The fake touches every page the same way, so its start follows
// the page cache: cold weights cost a disk read, warm ones almost nothing.
// (python/sglang/srt/model_loader/weight_utils.py; safetensors' safe_open keys().)

// checkpoint lists the files the loader reads under dir: *.safetensors, else
// *.bin / *.pt, sorted as SGLang's glob then sort does.
func checkpoint(dir string) (st, pt []string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			if d != nil && d.IsDir() && p != dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".safetensors":
			st = append(st, p)
		case ".bin", ".pt":
			pt = append(pt, p)
		}
		return nil
	})
	slices.Sort(st)
	slices.Sort(pt)
	return st, pt
}

// tensorRanges parses a safetensors header (8-byte little-endian length, then JSON whose
// entries carry data_offsets relative to the end of the header) and returns the file
// ranges of its tensors in the loader's order: by name.
func tensorRanges(f *os.File, size int64) ([][2]int64, error) {
	var n [8]byte
	if _, err := f.ReadAt(n[:], 0); err != nil {
		return nil, fmt.Errorf("Error while deserializing header: HeaderTooSmall")
	}
	hlen := binary.LittleEndian.Uint64(n[:])
	if hlen > 100<<20 || int64(hlen)+8 > size {
		return nil, fmt.Errorf("Error while deserializing header: HeaderTooLarge")
	}
	h := make([]byte, hlen)
	if _, err := f.ReadAt(h, 8); err != nil {
		return nil, fmt.Errorf("Error while deserializing header: %v", err)
	}
	var entries map[string]struct {
		Offsets [2]int64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(h, &entries); err != nil {
		return nil, fmt.Errorf("Error while deserializing header: InvalidHeaderDeserialization")
	}
	names := make([]string, 0, len(entries))
	for k := range entries {
		if k != "__metadata__" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	base := 8 + int64(hlen)
	out := make([][2]int64, 0, len(names))
	for _, k := range names {
		o := entries[k].Offsets
		if o[0] < 0 || o[1] < o[0] || base+o[1] > size {
			return nil, fmt.Errorf("Error while deserializing header: InvalidOffset(%q)", k)
		}
		out = append(out, [2]int64{base + o[0], base + o[1]})
	}
	return out, nil
}

// touch maps the file and reads one byte of every page: tensor by tensor in the loader's
// order when parse (a safetensors file), else front to back. It returns the bytes the
// tensors cover.
func touch(p string, parse bool) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return 0, err
	}
	size := st.Size()
	ranges := [][2]int64{{0, size}}
	if parse {
		if ranges, err = tensorRanges(f, size); err != nil {
			return 0, err
		}
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer syscall.Munmap(m)
	page := int64(os.Getpagesize())
	var sum byte
	var n int64
	for _, r := range ranges {
		for off := r[0]; off < r[1]; off += page {
			sum += m[off]
		}
		n += r[1] - r[0]
	}
	sink.Store(uint32(sum)) // the loads must happen: a sum nobody reads would be dropped
	return n, nil
}

// sink keeps the pages' checksum.
var sink atomic.Uint32

// loadCheckpoint reads the checkpoints under dirs (the model's and a draft model's) and
// logs SGLang's progress line with the real time it took.
func (s *server) loadCheckpoint(dirs ...string) error {
	for _, dir := range dirs {
		if !isLocalPath(dir) {
			continue
		}
		st, pt := checkpoint(dir)
		files, parse, kind := st, true, "safetensors"
		if len(st) == 0 {
			files, parse, kind = pt, false, "pt"
		}
		if len(files) == 0 {
			continue
		}
		start := time.Now()
		for _, p := range files {
			if _, err := touch(p, parse); err != nil {
				return err
			}
		}
		el := time.Since(start)
		rate := float64(len(files)) / max(el.Seconds(), 1e-9)
		s.log.raw(fmt.Sprintf("Loading %s checkpoint shards: 100%% Completed | %d/%d [%s<00:00, %.2fit/s]", kind, len(files), len(files), tqdmTime(el), rate))
	}
	return nil
}

// tqdmTime is tqdm's elapsed time: MM:SS.
func tqdmTime(d time.Duration) string {
	sec := int(d.Round(time.Second).Seconds())
	return fmt.Sprintf("%02d:%02d", sec/60, sec%60)
}
