package warm

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// checkpointExt are the files an engine reads a checkpoint from.
var checkpointExt = []string{".safetensors", ".bin", ".pt", ".pth", ".gguf"}

// startExt are the small files read at every start besides (config, the index of the
// shards, the tokenizer).
var startExt = []string{".json", ".model"}

// Checkpoint reports whether p is a checkpoint file by its name (not config or tokenizer).
func Checkpoint(p string) bool { return slices.Contains(checkpointExt, filepath.Ext(p)) }

// maxEntries bounds the walk of one model path: a model directory is small, and a model
// path of "/" must not walk the host.
const maxEntries = 10000

// WeightFiles lists the files a warm-up reads for the model paths an engine loads:
// a file as it is (llama.cpp's GGUF), a directory's checkpoint and start files, and
// those of its direct subdirectories except hidden ones (a Hub cache's .cache), at
// most maxEntries entries per path. Paths that are not local (a Hub repository id) and
// empty ones list nothing. Symbolic links (a Hub snapshot's) are followed. The list is
// sorted and has no duplicates.
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
		seen := 0
		err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if seen++; seen > maxEntries {
				return filepath.SkipAll
			}
			if d.IsDir() {
				rel, _ := filepath.Rel(p, q)
				if q != p && (strings.HasPrefix(d.Name(), ".") || strings.Contains(rel, string(filepath.Separator))) {
					return filepath.SkipDir
				}
				return nil
			}
			if !Checkpoint(q) && !slices.Contains(startExt, filepath.Ext(q)) {
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
