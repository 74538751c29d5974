package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// manifest is Dest/.agent-manifest.json: what was verified, and the stat it had then.
type manifest struct {
	Version int                      `json:"version"`
	Files   map[string]manifestEntry `json:"-"`
}

type manifestEntry struct {
	Name       string    `json:"name"`
	Size       int64     `json:"size"`
	MtimeNS    int64     `json:"mtime_ns"`
	SHA256     string    `json:"sha256,omitempty"`
	Source     string    `json:"source"`
	VerifiedAt time.Time `json:"verified_at"`
}

type manifestFile struct {
	Version int             `json:"version"`
	Files   []manifestEntry `json:"files"`
}

const manifestVersion = 1

// loadManifest reads the manifest; a missing one is empty. An unreadable or foreign one is
// treated as empty too (every file is then re-verified), since it is only an optimisation.
func loadManifest(root *os.Root) (*manifest, error) {
	m := &manifest{Version: manifestVersion, Files: map[string]manifestEntry{}}
	data, err := root.ReadFile(manifestName)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var mf manifestFile
	if json.Unmarshal(data, &mf) != nil || mf.Version != manifestVersion {
		return m, nil
	}
	for _, e := range mf.Files {
		m.Files[e.Name] = e
	}
	return m, nil
}

func (m *manifest) encode() ([]byte, error) {
	mf := manifestFile{Version: manifestVersion}
	for _, e := range m.Files {
		mf.Files = append(mf.Files, e)
	}
	slices.SortFunc(mf.Files, func(a, b manifestEntry) int { return strings.Compare(a.Name, b.Name) })
	data, err := json.MarshalIndent(mf, "", "  ")
	return append(data, '\n'), err
}

// record stats the file now in place and writes the manifest atomically.
func (r *run) record(f File, sum string) (manifestEntry, error) {
	fi, err := r.root.Stat(layoutOf(f.Name).final)
	if err != nil {
		return manifestEntry{}, err
	}
	e := manifestEntry{
		Name: f.Name, Size: fi.Size(), MtimeNS: fi.ModTime().UnixNano(),
		SHA256: sum, Source: f.source(), VerifiedAt: r.opts.Now().UTC(),
	}
	r.manMu.Lock()
	defer r.manMu.Unlock()
	r.man.Files[f.Name] = e
	data, err := r.man.encode()
	if err != nil {
		return e, err
	}
	if err := writeFileAtomic(r.root, manifestName, data, 0o600, true); err != nil {
		return e, fmt.Errorf("write manifest: %w", err)
	}
	return e, nil
}

// State is what Check concludes about a file.
type State int

const (
	// StateOK: present, and size and mtime match the manifest's verified entry.
	StateOK State = iota
	// StateVerify: present with the expected size but not proven by the manifest (mtime
	// changed, or no entry); it must be hashed.
	StateVerify
	// StateMissing: absent, of the wrong size or kind, or unverifiable; it must be downloaded.
	StateMissing
)

func (s State) String() string {
	switch s {
	case StateOK:
		return "ok"
	case StateVerify:
		return "verify"
	default:
		return "missing"
	}
}

// FileStatus is Check's verdict on one file.
type FileStatus struct {
	Name   string
	State  State
	Reason string // why it is not OK
	Size   int64  // size on disk, -1 if absent
	// Partial is the size of the file's partial download (0 if none), filled in by Check
	// for progress reports; a resume keeps at most the sidecar's checkpoint of it.
	Partial int64
}

// CheckResult is Check's verdict on a destination.
type CheckResult struct {
	Files []FileStatus // in the order given
	// Extra lists regular files and symlinks in Dest (slash-separated, sorted) that no File
	// names, leftover partial files of unnamed files included. They are never deleted.
	Extra []string
}

// Converged reports whether every file is proven in place.
func (c CheckResult) Converged() bool {
	for _, f := range c.Files {
		if f.State != StateOK {
			return false
		}
	}
	return true
}

// Check confirms a download from the manifest and os.Stat alone: it never reads file data.
// That is its contract: a file whose content changed while its size and mtime (ns) stayed the
// same is still reported OK; a changed size or mtime, or no manifest entry, asks for
// verification; a missing file asks for download.
func Check(ctx context.Context, dest string, files []File) (CheckResult, error) {
	res := CheckResult{Files: make([]FileStatus, len(files))}
	for _, f := range files {
		if err := checkName(f.Name); err != nil {
			return res, fmt.Errorf("fetch check: %w", err)
		}
	}
	root, err := os.OpenRoot(dest)
	if errors.Is(err, os.ErrNotExist) {
		for i, f := range files {
			res.Files[i] = FileStatus{Name: f.Name, State: StateMissing, Reason: "destination does not exist", Size: -1}
		}
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("fetch check: %w", err)
	}
	defer root.Close()
	m, err := loadManifest(root)
	if err != nil {
		return res, fmt.Errorf("fetch check: %w", err)
	}
	named := make(map[string]bool)
	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		res.Files[i] = classify(root, m, f)
		l := layoutOf(f.Name)
		if res.Files[i].State != StateOK {
			if fi, err := root.Lstat(l.partial); err == nil && fi.Mode().IsRegular() {
				res.Files[i].Partial = partialBytes(root, f, fi.Size())
			}
		}
		for _, p := range []string{l.final, l.partial, l.sidecar, l.sidecar + tmpSuffix, l.live, l.live + tmpSuffix} {
			named[filepath.ToSlash(p)] = true
		}
	}
	res.Extra, err = extras(ctx, dest, named)
	if err != nil {
		return res, fmt.Errorf("fetch check: %w", err)
	}
	return res, nil
}

// classify decides a file's state from the manifest and a stat of the file.
func classify(root *os.Root, m *manifest, f File) FileStatus {
	st := FileStatus{Name: f.Name, State: StateMissing, Size: -1}
	fi, err := root.Lstat(layoutOf(f.Name).final)
	switch {
	case errors.Is(err, os.ErrNotExist):
		st.Reason = "absent"
		return st
	case err != nil:
		st.Reason = err.Error()
		return st
	case !fi.Mode().IsRegular():
		st.Reason = fmt.Sprintf("not a regular file (%s)", fi.Mode().Type())
		return st
	}
	st.Size = fi.Size()
	if f.Size >= 0 && fi.Size() != f.Size {
		st.Reason = fmt.Sprintf("size %d, expected %d", fi.Size(), f.Size)
		return st
	}
	unproven := StateVerify
	if f.SHA256 == "" {
		unproven = StateMissing // nothing to hash against
	}
	e, ok := m.Files[f.Name]
	switch {
	case !ok:
		st.State, st.Reason = unproven, "not in the manifest"
	case f.SHA256 != "" && e.SHA256 != f.SHA256:
		st.State, st.Reason = unproven, "manifest records another sha256"
	case f.SHA256 == "" && e.Source != f.source():
		st.State, st.Reason = unproven, "manifest records another source"
	case e.Size != fi.Size():
		st.State, st.Reason = unproven, fmt.Sprintf("size changed since verified (%d, was %d)", fi.Size(), e.Size)
	case e.MtimeNS != fi.ModTime().UnixNano():
		st.State, st.Reason = unproven, "mtime changed since verified"
	default:
		st.State, st.Reason = StateOK, ""
	}
	return st
}

// extras walks dest for files no name claims, following no symlink inside it. A dest that
// is itself a symlink (a weights directory on another disk) is walked where it points.
func extras(ctx context.Context, dest string, named map[string]bool) ([]string, error) {
	if real, err := filepath.EvalSymlinks(dest); err == nil {
		dest = real
	}
	var out []string
	err := filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
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
		if rel == manifestName || rel == manifestName+tmpSuffix || rel == lockName || named[rel] {
			return nil
		}
		out = append(out, rel)
		return nil
	})
	slices.Sort(out)
	return out, err
}
