package testbin

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// WriteWeights writes a checkpoint of shards safetensors files of about shardSize bytes
// each under dir (model-0000i-of-0000n.safetensors, with the index file), on disk:
// the fake's load mode (FAKE_SGLANG=load) reads them as a lazy loader does, and a
// warm-up reads them ahead. Each shard holds tensors of 8 MiB at most, named so that
// their names' order is not their data's (a loader's order differs from the file's).
// It returns the shards' paths.
func WriteWeights(dir string, shards int, shardSize int64) ([]string, error) {
	const tensor = 8 << 20
	var paths []string
	index := map[string]string{}
	for s := 1; s <= shards; s++ {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s, shards)
		header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
		var off int64
		for i := 0; off < shardSize; i++ {
			n := min(tensor, shardSize-off)
			t := fmt.Sprintf("model.layers.%d.%s.weight", (s-1)*10000+i/2, [2]string{"self_attn.qkv_proj", "mlp.down_proj"}[i%2])
			header[t] = map[string]any{"dtype": "BF16", "shape": []int64{n / 2}, "data_offsets": []int64{off, off + n}}
			index[t] = name
			off += n
		}
		h, err := json.Marshal(header)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, name)
		if err := writeShard(p, h, off); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	idx, err := json.Marshal(map[string]any{"metadata": map[string]int64{"total_size": int64(shards) * shardSize}, "weight_map": index})
	if err != nil {
		return nil, err
	}
	return paths, os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
}

// writeShard writes one safetensors file: the header's length (8 bytes, little-endian),
// the header, and size bytes of data (not zeros a filesystem could keep as holes).
func writeShard(p string, header []byte, size int64) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
	if _, err := f.Write(append(n[:], header...)); err != nil {
		return err
	}
	buf := make([]byte, 4<<20)
	for i := range buf {
		buf[i] = byte(i*31 + 7)
	}
	for size > 0 {
		k := min(int64(len(buf)), size)
		if _, err := f.Write(buf[:k]); err != nil {
			return err
		}
		size -= k
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}
