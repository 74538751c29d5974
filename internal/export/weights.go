package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/agent-dev/agent/internal/proc"
)

// Weights is a weights directory a server loads.
type Weights struct {
	// Dest is the directory on the host (a container's path is mapped through its disk
	// devices; when it cannot be, the path inside the container).
	Dest string `json:"dest"`
	// InContainer is the directory as the server sees it, when it differs from Dest.
	InContainer string        `json:"in_container,omitempty"`
	Servers     []int         `json:"servers"` // PIDs
	Files       []WeightsFile `json:"files"`
	Size        int64         `json:"size"`
}

// WeightsFile is one file of a weights directory.
type WeightsFile struct {
	Name   string `json:"name"` // relative to Dest, slash-separated
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"` // only with --hash
}

// observeWeights lists the directories the servers load (their --model-path), with
// file sizes, and hashes them when asked.
func observeWeights(ctx context.Context, pfs proc.FS, servers []Server, hash bool) ([]Weights, []string) {
	var out []Weights
	var notes []string
	byDest := map[string]int{}
	for _, s := range servers {
		if s.ModelPath == "" {
			continue
		}
		if !filepath.IsAbs(s.ModelPath) {
			notes = append(notes, fmt.Sprintf("server pid %d loads %q, not a directory path (a Hub repository id?): no download block; the server fetches it itself", s.PID, s.ModelPath))
			continue
		}
		// Read through the process's own root, so a container's files are found too.
		seen := filepath.Join(procRoot(pfs), strconv.Itoa(s.PID), "root", s.ModelPath)
		if st, err := os.Stat(seen); err != nil || !st.IsDir() {
			if st, err := os.Stat(s.ModelPath); err == nil && st.IsDir() && s.Container == "" {
				seen = s.ModelPath
			} else {
				notes = append(notes, fmt.Sprintf("server pid %d: model path %s is not a readable directory: no download block", s.PID, s.ModelPath))
				continue
			}
		}
		dest := s.ModelPath
		inside := ""
		if s.Container != "" {
			inside = s.ModelPath
			dest = s.HostModelPath
			if dest == "" {
				dest = s.ModelPath
				notes = append(notes, fmt.Sprintf("server pid %d: %s is inside container %s and no disk device maps it to the host: the download's dest is that path, to be fixed by hand", s.PID, s.ModelPath, s.Container))
			}
		}
		if i, ok := byDest[dest]; ok {
			out[i].Servers = append(out[i].Servers, s.PID)
			continue
		}
		w := Weights{Dest: dest, InContainer: inside, Servers: []int{s.PID}, Files: []WeightsFile{}}
		err := filepath.WalkDir(seen, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if !d.Type().IsRegular() {
				return nil
			}
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasSuffix(name, ".partial") {
				return nil // the agent's manifest and partial files, editors' droppings
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(seen, p)
			f := WeightsFile{Name: filepath.ToSlash(rel), Size: info.Size()}
			if hash {
				if f.SHA256, err = sha256File(p); err != nil {
					return err
				}
			}
			w.Files = append(w.Files, f)
			w.Size += f.Size
			return nil
		})
		if err != nil {
			notes = append(notes, fmt.Sprintf("weights %s: %v", s.ModelPath, err))
			continue
		}
		sort.Slice(w.Files, func(i, j int) bool { return w.Files[i].Name < w.Files[j].Name })
		byDest[dest] = len(out)
		out = append(out, w)
	}
	return out, notes
}

func sha256File(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
