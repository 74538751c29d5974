package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agent-dev/agent/internal/bytesize"
)

// File is one file to bring into Dest.
type File struct {
	// Name is the path relative to Dest, with forward slashes ("model-00001.safetensors",
	// "tokenizer/vocab.json"). Absolute names, ".." and names that resolve through a symlink
	// outside Dest are refused.
	Name string
	// URL is fetched with GET (https, or http on a loopback host or with Options.Insecure).
	URL string
	// Size is the expected size in bytes, -1 when unknown.
	Size int64
	// SHA256 is the expected lower-case hex digest. It may be empty only with GitBlob or
	// Options.AllowUnverified.
	SHA256 string
	// GitBlob is the expected git object id (sha1 of "blob SIZE\x00" + content, 40
	// lower-case hex digits), for files a Hub repository keeps in git rather than LFS,
	// which have no sha256. These are small (the Hub sends larger files to LFS), so the
	// partial file is read once more to check it, before it is renamed into place.
	GitBlob string
	// Header is sent with requests to the URL's own scheme and host only (Authorization),
	// never to another host after a redirect.
	Header http.Header
	// Source is what the manifest records as the origin (a repository commit); URL if empty.
	Source string
	// Mirrors are URLs of the same file on hosts that already hold it (any static file
	// server over a verified download), asked in order before URL. Each copy is verified
	// against SHA256 or GitBlob exactly as the URL's would be, so a file with neither has
	// no mirrors. Plain http is allowed to any host: nothing a mirror sends is trusted
	// before it verifies. Header never goes to a mirror of another origin.
	Mirrors []string
}

func (f File) source() string {
	if f.Source != "" {
		return f.Source
	}
	return f.URL
}

// Options configure Fetch. The zero value of each field means its default.
type Options struct {
	// Dest is the destination directory; it is created if missing.
	Dest string
	// Concurrency is how many files transfer at once (default 4).
	Concurrency int
	// Connections is how many ranges of one file transfer at once, each on its own
	// connection (default 8; 1 fetches every file as one stream). A CDN that caps each
	// connection is read at Connections times its cap.
	Connections int
	// MaxConnections caps the connections of the whole Fetch (default 32).
	MaxConnections int
	// PieceSize is the length of the ranges a file is cut into (default: a quarter of the
	// file per connection, between 16 and 64 MiB). Files no larger than one piece are
	// fetched as one stream.
	PieceSize int64
	// StallTimeout aborts a connection that delivered no byte for this long and resumes it,
	// counting as a retry (default 60s).
	StallTimeout time.Duration
	// Retries is how many failed attempts per file are retried (default 3; negative: none).
	// A restart from zero because the server ignored a range or the file changed is not a
	// failed attempt.
	Retries int
	// RetryBackoff is the first wait between attempts, doubled each time up to 30s
	// (default 1s).
	RetryBackoff time.Duration
	// Client is used for all requests (default: a fresh transport without a client timeout).
	// Its Transport is wrapped and its CheckRedirect replaced.
	Client *http.Client
	// Progress, if set, receives snapshots at most every ProgressInterval and a final one.
	// It is called from one goroutine at a time and should return quickly.
	Progress func(Progress)
	// ProgressInterval defaults to 200ms.
	ProgressInterval time.Duration
	// CheckpointEvery is how many bytes stream in between checkpoints of the sha256 state
	// (default 64 MiB). It bounds what a crash costs.
	CheckpointEvery int64
	// FreeSpaceMargin is kept free on Dest's filesystem beyond the missing bytes
	// (default 256 MiB; negative disables the check).
	FreeSpaceMargin int64
	// Insecure allows plain http to any host.
	Insecure bool
	// AllowUnverified allows files without SHA256; they are checked by size only.
	AllowUnverified bool
	// Now is the clock for manifest timestamps (default time.Now).
	Now func() time.Time
}

const (
	defaultConcurrency     = 4
	defaultConnections     = 8
	defaultMaxConnections  = 32
	defaultStallTimeout    = 60 * time.Second
	defaultRetries         = 3
	defaultRetryBackoff    = time.Second
	maxRetryBackoff        = 30 * time.Second
	defaultProgressEvery   = 200 * time.Millisecond
	defaultCheckpointEvery = 64 << 20
	defaultFreeSpaceMargin = 256 << 20
	copyBufferSize         = 256 << 10
)

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = defaultConcurrency
	}
	if o.Connections <= 0 {
		o.Connections = defaultConnections
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = defaultMaxConnections
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = defaultStallTimeout
	}
	switch {
	case o.Retries == 0:
		o.Retries = defaultRetries
	case o.Retries < 0:
		o.Retries = 0
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = defaultRetryBackoff
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = defaultProgressEvery
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = defaultCheckpointEvery
	}
	if o.FreeSpaceMargin == 0 {
		o.FreeSpaceMargin = defaultFreeSpaceMargin
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Sentinel errors callers may branch on with errors.Is.
var (
	ErrUnsafeName   = errors.New("unsafe file name")
	ErrInsecureURL  = errors.New("insecure url")
	ErrUnverified   = errors.New("no sha256 given")
	ErrNoSpace      = errors.New("not enough free space")
	ErrChecksum     = errors.New("checksum mismatch")
	ErrSize         = errors.New("size mismatch")
	ErrCompressed   = errors.New("compressed response refused")
	ErrStalled      = errors.New("transfer stalled")
	ErrLocked       = errors.New("destination in use by another fetch")
	ErrBadResponse  = errors.New("unexpected response")
	ErrDiskFull     = errors.New("disk full")
	errNotInstalled = errors.New("response body not instrumented")
)

// Action says what Fetch did for a file.
type Action int

const (
	// ActionFailed: the file is not in place (see FileResult.Err).
	ActionFailed Action = iota
	// ActionSkipped: the manifest and os.Stat proved the file good; nothing was read.
	ActionSkipped
	// ActionVerified: the file on disk was hashed and matched; nothing was downloaded.
	ActionVerified
	// ActionDownloaded: the file was (partly) downloaded, verified and renamed into place.
	ActionDownloaded
)

func (a Action) String() string {
	switch a {
	case ActionSkipped:
		return "skipped"
	case ActionVerified:
		return "verified"
	case ActionDownloaded:
		return "downloaded"
	default:
		return "failed"
	}
}

// FileResult reports one file.
type FileResult struct {
	Name   string
	Path   string // absolute path of the file in Dest
	Size   int64  // verified size, -1 if not in place
	SHA256 string // verified digest (empty if unverified or not in place)
	Action Action
	// Attempts counts transfer attempts, Restarts those that started over from zero because
	// the server ignored a range or the file changed.
	Attempts, Restarts int
	// Stolen counts ranges split off a connection much slower than the others and handed
	// to a faster one (work stealing).
	Stolen int
	// ResumedFrom is the partial offset the first attempt resumed from (0: from scratch).
	ResumedFrom int64
	// Fetched counts body bytes received for this file in this call; OriginBytes those of
	// them that came from URL rather than a mirror.
	Fetched, OriginBytes int64
	// From is the URL the file was downloaded from this call: a mirror's or URL; empty
	// when nothing was downloaded.
	From string
	// MirrorErrors says why each mirror tried before From was passed over (a miss, an
	// error, a copy that did not verify).
	MirrorErrors []error
	Err          error
}

// Result reports a Fetch, one FileResult per File in the given order.
type Result struct {
	Files   []FileResult
	Fetched int64 // body bytes received in this call, all files
}

// Fetch brings files into opts.Dest: files the manifest proves good are skipped, files whose
// stat changed are hashed, the rest are downloaded (resuming partial files), verified and
// renamed into place. Files are independent: one failing does not stop the others. The
// error joins the per-file errors; Result says what happened to each file.
func Fetch(ctx context.Context, files []File, opts Options) (Result, error) {
	opts = opts.withDefaults()
	res := Result{Files: make([]FileResult, len(files))}
	for i, f := range files {
		res.Files[i] = FileResult{Name: f.Name, Size: -1}
	}
	if opts.Dest == "" {
		return res, errors.New("fetch: no destination directory")
	}
	if err := validate(files, opts); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	destAbs, err := filepath.Abs(opts.Dest)
	if err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	if err := os.MkdirAll(destAbs, 0o755); err != nil {
		return res, fmt.Errorf("fetch: create destination: %w", err)
	}
	r, err := newRun(destAbs, opts)
	if err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	defer r.close()
	for i := range files {
		res.Files[i].Path = filepath.Join(destAbs, filepath.FromSlash(files[i].Name))
		if err := r.checkResolved(files[i].Name); err != nil {
			return res, fmt.Errorf("fetch: %w", err)
		}
	}
	unlock, err := r.lock()
	if err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	defer unlock()

	r.man, err = loadManifest(r.root)
	if err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}
	tasks := make([]*task, len(files))
	for i, f := range files {
		t := newTask(f, &res.Files[i])
		t.status = classify(r.root, r.man, f)
		if t.status.State == StateOK {
			t.setState(FileSkipped)
			t.done.Store(t.status.Size)
			t.total.Store(t.status.Size)
			e := r.man.Files[f.Name]
			t.fr.Action, t.fr.Size, t.fr.SHA256 = ActionSkipped, e.Size, e.SHA256
		}
		tasks[i] = t
	}
	if err := r.checkSpace(tasks); err != nil {
		return res, fmt.Errorf("fetch: %w", err)
	}

	stopProgress := r.startProgress(tasks)
	work := make(chan *task)
	var wg sync.WaitGroup
	for range min(opts.Concurrency, max(len(tasks), 1)) {
		wg.Go(func() {
			for t := range work {
				r.process(ctx, t)
			}
		})
	}
	for _, t := range tasks {
		if t.status.State != StateOK {
			work <- t
		}
	}
	close(work)
	wg.Wait()
	stopProgress()

	var errs []error
	for i := range res.Files {
		res.Fetched += res.Files[i].Fetched
		if e := res.Files[i].Err; e != nil {
			errs = append(errs, e)
		}
	}
	return res, errors.Join(errs...)
}

// process brings one file into place and records the outcome in its FileResult.
func (r *run) process(ctx context.Context, t *task) {
	err := r.processErr(ctx, t)
	t.fr.Fetched = t.recv.Load()
	if err != nil {
		t.fr.Action, t.fr.Err = ActionFailed, fmt.Errorf("fetch %s: %w", t.f.Name, err)
		t.setState(FileFailed)
		return
	}
	t.setState(FileDone)
}

func (r *run) processErr(ctx context.Context, t *task) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.status.State == StateVerify {
		ok, err := r.verifyExisting(ctx, t)
		if err != nil {
			return err
		}
		if ok {
			t.fr.Action = ActionVerified
			return nil
		}
	}
	if err := r.download(ctx, t); err != nil {
		return err
	}
	t.fr.Action = ActionDownloaded
	return nil
}

// checkSpace compares the bytes still missing with the free space of Dest's filesystem.
// Files to be re-verified count as present; unknown sizes count as zero here, and each is
// checked alone once its size is learned.
func (r *run) checkSpace(tasks []*task) error {
	if r.opts.FreeSpaceMargin < 0 {
		return nil
	}
	var missing int64
	for _, t := range tasks {
		if t.status.State != StateMissing || t.f.Size < 0 {
			continue
		}
		missing += t.f.Size - r.resumableOffset(t)
	}
	return r.checkFree(missing)
}

// checkFree fails with ErrNoSpace unless missing bytes plus the margin fit on Dest's
// filesystem.
func (r *run) checkFree(missing int64) error {
	if missing == 0 || r.opts.FreeSpaceMargin < 0 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(r.destAbs, &st); err != nil {
		return fmt.Errorf("free space of %s: %w", r.destAbs, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	need := missing + r.opts.FreeSpaceMargin
	if free < need {
		return fmt.Errorf("%w on %s: %s (%d bytes) free, need %s (%d bytes): %s missing plus a %s margin",
			ErrNoSpace, r.destAbs, bytesize.Format(free), free, bytesize.Format(need), need,
			bytesize.Format(missing), bytesize.Format(r.opts.FreeSpaceMargin))
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
