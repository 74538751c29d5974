package warm

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// weightExt are the files an engine reads a checkpoint from; besides them a warm-up reads
// the small files read at every start (config, the index of the shards, the tokenizer).
var weightExt = []string{".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model"}

// WeightFiles lists the files a warm-up reads for the model paths an engine loads:
// a file as it is (llama.cpp's GGUF), a directory's checkpoint files, in its
// subdirectories too except hidden ones (a Hub cache's .cache). Paths that are not
// local (a Hub repository id) and empty ones list nothing. Symbolic links (a Hub
// snapshot's) are followed. The list is sorted and has no duplicates.
func WeightFiles(paths ...string) ([]string, error) {
	var out []string
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			out = append(out, p)
			continue
		}
		err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if q != p && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if !slices.Contains(weightExt, filepath.Ext(q)) {
				return nil
			}
			if st, err := os.Stat(q); err == nil && st.Mode().IsRegular() {
				out = append(out, q)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
