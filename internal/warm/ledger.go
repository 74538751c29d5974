package warm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-dev/agent/internal/atomicfile"
)

// Cold starts, measured where they happen. Readers beside a cold start read the pages
// the engine is about to read, ahead of it: on fast storage the start is shorter; on
// slow storage (one spindle, a network filesystem) the two streams of reads seek against
// each other and the start is longer (pegainfer#950 measured +16 %). No rule of thumb
// tells the two apart, so the agent measures both on the host's own storage, once each,
// per filesystem and model, and keeps the readers away where they measured slower.

// LedgerFile is the ledger's file in the state directory.
const LedgerFile = "warm-starts.json"

// MinColdBytes is the least a start must read cold to be measured: below it the
// engine's fixed costs (CUDA, graphs) drown the reading.
const MinColdBytes = 64 << 20

// slowerBy is the margin a start with readers must lose by to count as slower: starts
// vary by a few per cent from one to the next.
const slowerBy = 1.10

// ColdStart is the measured cost of cold starts of one kind: seconds from launch to
// ready per GiB read cold, averaged over the last few.
type ColdStart struct {
	SecondsPerGiB float64   `json:"seconds_per_gib"`
	Starts        int       `json:"starts"`
	At            time.Time `json:"at"`
}

// coldStarts are the figures of one filesystem and model.
type coldStarts struct {
	Beside *ColdStart `json:"beside,omitempty"` // readers beside the engine
	Alone  *ColdStart `json:"alone,omitempty"`  // the engine alone
}

// Ledger keeps the cold starts' figures in a JSON file of the state directory. Two
// servers starting at once may each write it: the last write wins and a figure is
// measured again at a later start, which costs nothing but that start's choice.
type Ledger struct{ path string }

// NewLedger is the ledger of the state directory dir.
func NewLedger(dir string) *Ledger { return &Ledger{path: filepath.Join(dir, LedgerFile)} }

// Key names the filesystem and model of a checkpoint's files: the device the first
// file lies on and its directory.
func Key(files []string) (string, error) {
	if len(files) == 0 {
		return "", errors.New("no weight files")
	}
	var st unix.Stat_t
	if err := unix.Stat(files[0], &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", files[0], err)
	}
	return fmt.Sprintf("dev %d:%d %s", unix.Major(st.Dev), unix.Minor(st.Dev), filepath.Dir(files[0])), nil
}

func (l *Ledger) load() (map[string]coldStarts, error) {
	all := map[string]coldStarts{}
	b, err := os.ReadFile(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return all, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("%s: %w (delete it: the figures are measured again)", l.path, err)
	}
	return all, nil
}

// Beside says whether a cold start of key's weights runs the readers beside the engine,
// and why not when it does not: the first cold start runs them, the next runs without
// them to compare, and from then on they run unless they measured slower.
func (l *Ledger) Beside(key string) (bool, string) {
	all, err := l.load()
	if err != nil {
		return true, "" // unreadable figures: as if none, the default
	}
	e := all[key]
	switch {
	case e.Beside == nil:
		return true, ""
	case e.Alone == nil:
		return false, fmt.Sprintf("measuring one cold start without the readers on this filesystem, to compare (with them: %.1f s/GiB)", e.Beside.SecondsPerGiB)
	case e.Beside.SecondsPerGiB > e.Alone.SecondsPerGiB*slowerBy:
		return false, fmt.Sprintf("on this filesystem cold starts measured slower with the readers beside (%.1f s/GiB against %.1f without)", e.Beside.SecondsPerGiB, e.Alone.SecondsPerGiB)
	}
	return true, ""
}

// Record adds a cold start of key's weights: seconds from launch to ready with cold
// bytes not resident before, with the readers beside it or not. Starts that read less
// than MinColdBytes cold are not figures.
func (l *Ledger) Record(key string, beside bool, seconds float64, cold int64, at time.Time) error {
	if cold < MinColdBytes || seconds <= 0 {
		return nil
	}
	all, err := l.load()
	if err != nil {
		all = map[string]coldStarts{}
	}
	e := all[key]
	f := &e.Alone
	if beside {
		f = &e.Beside
	}
	per := seconds / (float64(cold) / (1 << 30))
	if *f == nil {
		*f = &ColdStart{}
	}
	n := min((*f).Starts, 4) // the mean of about the last five
	(*f).SecondsPerGiB = ((*f).SecondsPerGiB*float64(n) + per) / float64(n+1)
	(*f).Starts++
	(*f).At = at.UTC()
	all[key] = e
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(l.path, append(b, '\n'), 0o644)
}

// ColdBytes is how much of files is not in the page cache now.
func ColdBytes(files []string) (int64, error) {
	var cold int64
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			return 0, err
		}
		r, err := Resident(f)
		if err != nil {
			return 0, err
		}
		cold += fi.Size() - r
	}
	return cold, nil
}
