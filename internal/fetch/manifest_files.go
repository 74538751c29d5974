package fetch

import (
	"errors"
	"os"
	"sort"
)

// ManifestName is the manifest's file name in a destination directory.
const ManifestName = manifestName

// ManifestFiles lists the files the manifest in dest records as verified, by name
// relative to dest, sorted: exactly what a download placed there (a download's delete
// removes these and nothing else). A missing dest or manifest lists nothing.
func ManifestFiles(dest string) ([]string, error) {
	root, err := os.OpenRoot(dest)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer root.Close()
	m, err := loadManifest(root)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(m.Files))
	for n := range m.Files {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}
