package fetch

import (
	"errors"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Own reports whether a path in a destination directory (relative, slash-separated) is
// one of the files fetch itself keeps there: the manifest, the lock, a file's partial
// and its sidecars. Plans may not name such files (checkName), so whatever has one of
// these names is fetch's, and deleting a download deletes them too.
func Own(rel string) bool {
	base := path.Base(rel)
	return base == manifestName || base == lockName || strings.HasPrefix(base, manifestName) ||
		(strings.HasPrefix(base, ".") && (strings.HasSuffix(base, partialSuffix) ||
			strings.HasSuffix(base, sidecarSuffix) || strings.HasSuffix(base, sidecarSuffix+tmpSuffix) ||
			strings.HasSuffix(base, liveSuffix) || strings.HasSuffix(base, liveSuffix+tmpSuffix)))
}

// Contents lists the files under dest (relative, slash-separated, sorted), split into
// those fetch keeps (Own) and the others; none when dest does not exist.
func Contents(dest string) (own, others []string, err error) {
	err = filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dest && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(dest, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if Own(rel) {
			own = append(own, rel)
		} else {
			others = append(others, rel)
		}
		return nil
	})
	slices.Sort(own)
	slices.Sort(others)
	return own, others, err
}
