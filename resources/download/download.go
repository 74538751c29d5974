// Package download is the `download` resource kind: files fetched, verified and kept
// from a Hugging Face repository, a mirror or explicit URLs.
package download

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/trust"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// DownloadConfig is the `download` block.
type DownloadConfig struct {
	Dest            string               `hcl:"dest"`
	Concurrency     *int                 `hcl:"concurrency,optional"`
	Connections     *int                 `hcl:"connections,optional"`
	MaxConnections  *int                 `hcl:"max_connections,optional"`
	StallTimeout    *string              `hcl:"stall_timeout,optional"`
	Timeout         *string              `hcl:"timeout,optional"`
	Insecure        *bool                `hcl:"insecure,optional"`
	CheckpointEvery *int64               `hcl:"checkpoint_every,optional"`
	Files           []DownloadFileConfig `hcl:"file,block"`
	HuggingFace     *DownloadHubConfig   `hcl:"huggingface,block"`
	Mirrors         []string             `hcl:"mirrors,optional"`
	Ensure          *string              `hcl:"ensure,optional"` // "absent": download_delete.go
}

// DownloadFileConfig is a `file "NAME" { url, sha256, size }` block of a download.
type DownloadFileConfig struct {
	Name   string `hcl:"name,label"`
	URL    string `hcl:"url"`
	SHA256 string `hcl:"sha256"`
	Size   *int64 `hcl:"size,optional"`
}

// DownloadHubConfig is the `huggingface` block of a download.
type DownloadHubConfig struct {
	Repo      string   `hcl:"repo"`
	Revision  *string  `hcl:"revision,optional"`
	Include   []string `hcl:"include,optional"`
	Exclude   []string `hcl:"exclude,optional"`
	TokenFile *string  `hcl:"token_file,optional"`
	Endpoint  *string  `hcl:"endpoint,optional"`
}

const (
	defaultDownloadTimeout = 24 * time.Hour
	defaultHubEndpoint     = "https://huggingface.co"
	// hubResolveTTL is how long a branch resolved by this process is trusted: the Check,
	// Apply and verifying Check of one apply see the same commit.
	hubResolveTTL = 15 * time.Minute
	// progressSaveEvery is how often Apply records its progress in state for `agent status`
	// run from another process.
	progressSaveEvery = time.Second
	// progressStale: a progress record not updated for this long belongs to a dead apply.
	progressStale = 15 * time.Second
)

// Download brings a set of files (model weights) into a directory, resumable, concurrent
// and verified, from explicit URLs or a Hugging Face repository. See docs/download.md.
type Download struct {
	addr        string
	dest        string
	concurrency int
	connections int // ranges of one file at once (0: fetch's default, 8)
	maxConns    int // connections of the whole download (0: fetch's default, 32)
	stall       time.Duration
	timeout     time.Duration
	insecure    bool
	checkpoint  int64
	files       []fetch.File // explicit files
	hub         *hubSource
	mirrors     []string // base URLs of hosts holding the same files, asked first
	getenv      func(string) string

	mu   sync.Mutex
	memo *hubMemo // a branch resolved by this process

	resources.Deletion // ensure = "absent", agent destroy, an orphan: download_delete.go
}

type hubSource struct {
	repo, revision, endpoint, tokenFile string
	include, exclude                    globSet
}

type hubMemo struct {
	listing *hubListing
	at      time.Time
}

var (
	_ agent.Resource  = (*Download)(nil)
	_ agent.Statuser  = (*Download)(nil)
	_ agent.Timeouter = (*Download)(nil)
)

// DownloadKind is the `download` resource kind.
func DownloadKind(h resources.Machine) agent.Kind {
	k := agent.NewKind("download", func(r *plans.Resource, c *DownloadConfig) (agent.Resource, hcl.Diagnostics) {
		res, diags := bindDownload(r, c)
		if d, ok := res.(*Download); ok && d != nil {
			diags = append(diags, d.bindEnsure(r, c.Ensure)...)
		}
		if diags.HasErrors() {
			return nil, diags
		}
		return res, diags
	})
	k.Orphan = orphanDownload
	return k
}

func bindDownload(r *plans.Resource, c *DownloadConfig) (agent.Resource, hcl.Diagnostics) {
	b := &resources.Binder{R: r}
	bad := b.Bad
	d := &Download{addr: r.Addr, dest: c.Dest, concurrency: 4, stall: 60 * time.Second,
		timeout: defaultDownloadTimeout, insecure: resources.Deref(c.Insecure), getenv: os.Getenv}
	if !filepath.IsAbs(c.Dest) {
		bad(r.Range("dest"), "Relative destination", fmt.Sprintf("dest %q must be absolute.", c.Dest))
	} else if resources.HasDotDot(c.Dest) {
		bad(r.Range("dest"), "Destination with ..", fmt.Sprintf("dest %q has a \"..\" element; write the directory it means (%s), so the plan says where files land.", c.Dest, filepath.Clean(c.Dest)))
	} else {
		d.dest = filepath.Clean(c.Dest)
	}
	if c.Concurrency != nil {
		if *c.Concurrency < 1 || *c.Concurrency > 64 {
			bad(r.Range("concurrency"), "Invalid concurrency", "concurrency is the number of files fetched at once, 1 to 64.")
		}
		d.concurrency = *c.Concurrency
	}
	if c.Connections != nil {
		if *c.Connections < 1 || *c.Connections > 64 {
			bad(r.Range("connections"), "Invalid connections", "connections is the number of ranges of one file fetched at once, each on its own connection, 1 to 64 (default 8).")
		}
		d.connections = *c.Connections
	}
	if c.MaxConnections != nil {
		if *c.MaxConnections < 1 || *c.MaxConnections > 256 {
			bad(r.Range("max_connections"), "Invalid max_connections", "max_connections caps the connections of the whole download, 1 to 256 (default 32).")
		}
		d.maxConns = *c.MaxConnections
	}
	dur := func(attr string, v *string, into *time.Duration) {
		if v == nil {
			return
		}
		t, err := time.ParseDuration(*v)
		if err != nil || t <= 0 {
			b.BadValue(r.Range(attr), "Invalid duration", fmt.Sprintf("%s %q is not a positive duration such as \"60s\" or \"24h\".", attr, *v))
			return
		}
		*into = t
	}
	dur("stall_timeout", c.StallTimeout, &d.stall)
	dur("timeout", c.Timeout, &d.timeout)
	if c.CheckpointEvery != nil {
		if *c.CheckpointEvery < 4096 {
			bad(r.Range("checkpoint_every"), "Invalid checkpoint_every", "checkpoint_every is a byte count of at least 4096 (default 64 MiB).")
		}
		d.checkpoint = *c.CheckpointEvery
	}
	for _, m := range c.Mirrors {
		base, err := mirrorBase(m)
		if err != nil {
			bad(r.Range("mirrors"), "Invalid mirror", err.Error()+".")
			continue
		}
		d.mirrors = append(d.mirrors, base)
	}
	switch {
	case len(c.Files) > 0 && c.HuggingFace != nil:
		bad(r.DeclRange, "Two sources", "A download takes its files from file blocks or from a huggingface block, not both.")
	case len(c.Files) == 0 && c.HuggingFace == nil:
		bad(r.DeclRange, "No source", "A download needs file \"NAME\" { url, sha256, size } blocks or a huggingface { repo } block.")
	}
	d.bindFiles(b, c.Files)
	d.bindHub(b, c.HuggingFace)
	if b.Diags.HasErrors() {
		return nil, b.Diags
	}
	return d, nil
}

// bindFiles reads the file blocks: clean names inside dest, allowed URLs, a sha256 each.
func (d *Download) bindFiles(b *resources.Binder, files []DownloadFileConfig) {
	r, bad := b.R, b.Bad
	seen := map[string]bool{}
	for _, f := range files {
		rng := r.Range("file")
		if seen[f.Name] {
			bad(rng, "Duplicate file", fmt.Sprintf("file %q is declared twice.", f.Name))
		}
		seen[f.Name] = true
		if err := hubSafePath(f.Name); err != nil {
			bad(rng, "Unsafe file name", fmt.Sprintf("file %q: names are clean relative paths inside dest.", f.Name))
		}
		u, err := url.Parse(f.URL)
		if err != nil {
			bad(rng, "Invalid URL", fmt.Sprintf("file %q: %v", f.Name, err))
		} else if err := allowedURL(u, d.insecure); err != nil {
			bad(rng, "Insecure URL", fmt.Sprintf("file %q: %v", f.Name, err))
		}
		sum := strings.ToLower(f.SHA256)
		if raw, err := hex.DecodeString(sum); err != nil || len(raw) != 32 {
			bad(rng, "Invalid sha256", fmt.Sprintf("file %q: sha256 must be 64 hex digits: every file is verified.", f.Name))
		}
		size := int64(-1)
		if f.Size != nil {
			if *f.Size < 0 {
				bad(rng, "Invalid size", fmt.Sprintf("file %q: size %d is negative.", f.Name, *f.Size))
			}
			size = *f.Size
		}
		d.files = append(d.files, fetch.File{Name: f.Name, URL: f.URL, Size: size, SHA256: sum})
	}
}

// bindHub reads the huggingface block: a repository id, a revision, an allowed endpoint,
// the token file and the include and exclude patterns.
func (d *Download) bindHub(b *resources.Binder, h *DownloadHubConfig) {
	if h == nil {
		return
	}
	r, bad := b.R, b.Bad
	src := &hubSource{repo: h.Repo, revision: "main", endpoint: defaultHubEndpoint, tokenFile: resources.Deref(h.TokenFile)}
	if h.Revision != nil {
		src.revision = *h.Revision
	}
	if h.Endpoint != nil {
		src.endpoint = strings.TrimRight(*h.Endpoint, "/")
	}
	if parts := strings.Split(h.Repo, "/"); len(parts) > 2 || h.Repo == "" || slices.ContainsFunc(parts, func(p string) bool { return p == "" || p == "." || p == ".." }) {
		bad(r.Range("huggingface", "repo"), "Invalid repo", fmt.Sprintf("repo %q is not a repository id such as \"Qwen/Qwen3.6-27B\".", h.Repo))
	}
	if src.revision == "" || strings.Contains(src.revision, "..") {
		bad(r.Range("huggingface", "revision"), "Invalid revision", "revision is a branch, a tag or a commit hash.")
	}
	if u, err := url.Parse(src.endpoint); err != nil || allowedURL(u, d.insecure) != nil {
		bad(r.Range("huggingface", "endpoint"), "Invalid endpoint", fmt.Sprintf("endpoint %q must be an https URL (or http to a loopback host, or insecure = true).", src.endpoint))
	}
	if src.tokenFile != "" && !filepath.IsAbs(src.tokenFile) {
		bad(r.Range("huggingface", "token_file"), "Relative token_file", "token_file must be an absolute path.")
	}
	var err error
	if src.include, err = compileGlobs(h.Include); err != nil {
		bad(r.Range("huggingface", "include"), "Invalid pattern", err.Error())
	}
	if src.exclude, err = compileGlobs(h.Exclude); err != nil {
		bad(r.Range("huggingface", "exclude"), "Invalid pattern", err.Error())
	}
	d.hub = src
}

// Timeout is the step timeout: downloads are long (default 24h, the plan's `timeout`).
func (d *Download) Timeout() time.Duration { return d.timeout }

// downloadRecord is the resource's state: the Hub listing (a cache of remote facts, keyed
// by endpoint, repo and commit) and the progress of a running apply.
type downloadRecord struct {
	// Dest is where the files went: an orphan's delete finds its manifest there.
	Dest     string          `json:"dest,omitempty"`
	Hub      *hubListing     `json:"huggingface,omitempty"`
	Progress *progressRecord `json:"progress,omitempty"`
}

// downloadDetail is what Check found, for Apply.
type downloadDetail struct {
	files   []fetch.File
	listing *hubListing // nil for explicit files
}

// target is the resolved set of files of a Check or Status.
type target struct {
	files    []fetch.File
	listing  *hubListing
	warnings []string
	fresh    bool // the listing came from the network
}

// resolveTarget returns the files the plan wants. Explicit files need nothing. A Hub source
// pinned to a commit is served from the listing cached in state with no request at all; a
// branch or tag costs one small request (the revision's commit) unless this process
// resolved it in the last minutes, and the tree is listed again only when the commit moved.
// If the Hub cannot be reached and a listing of the same revision is cached, that listing is
// used with a warning.
func (d *Download) resolveTarget(ctx context.Context, env *agent.Env) (*target, error) {
	if d.hub == nil {
		return &target{files: d.files}, nil
	}
	h := d.hub
	var rec downloadRecord
	if _, err := env.State.Load(&rec); err != nil {
		return nil, err
	}
	now := time.Now()
	if env.Now != nil {
		now = env.Now()
	}
	cached := rec.Hub
	if !cached.matches(h.endpoint, h.repo, h.revision) {
		cached = nil
	}
	var listing *hubListing
	var warnings []string
	fresh := false
	d.mu.Lock()
	memo := d.memo
	d.mu.Unlock()
	switch {
	case cached != nil && isCommit(h.revision):
		listing = cached
	case memo != nil && memo.listing.matches(h.endpoint, h.repo, h.revision) && now.Sub(memo.at) < hubResolveTTL:
		listing = memo.listing
	default:
		token, tokenWarn, err := d.token()
		if err != nil {
			return nil, err
		}
		warnings = append(warnings, tokenWarn...)
		hc, err := newHubClient(h.endpoint, token, d.insecure)
		if err != nil {
			return nil, err
		}
		commit, err := hc.resolve(ctx, h.repo, h.revision)
		if err != nil {
			if cached != nil && ctx.Err() == nil {
				warnings = append(warnings, fmt.Sprintf("could not reach the Hub (%v); using commit %s of %q listed %s",
					err, cached.Commit, h.revision, agent.HumanTime(cached.ListedAt)))
				listing = cached
				break
			}
			return nil, err
		}
		if cached != nil && cached.Commit == commit {
			listing = cached
		} else {
			files, err := hc.list(ctx, h.repo, commit)
			if err != nil {
				return nil, err
			}
			listing = &hubListing{Endpoint: h.endpoint, Repo: h.repo, Revision: h.revision, Commit: commit, ListedAt: now.UTC(), Files: files}
			fresh = true
		}
		if !isCommit(h.revision) {
			d.mu.Lock()
			d.memo = &hubMemo{listing: listing, at: now}
			d.mu.Unlock()
		}
	}
	// The token is attached in Apply only: Check reads no data.
	t := &target{listing: listing, warnings: warnings, fresh: fresh}
	for _, f := range listing.Files {
		if (len(h.include) > 0 && !h.include.match(f.Path)) || h.exclude.match(f.Path) {
			continue
		}
		ff := fetch.File{Name: f.Path, Size: f.Size, SHA256: f.SHA256,
			URL: (&hubClient{endpoint: mustURL(h.endpoint)}).fileURL(h.repo, listing.Commit, f.Path)}
		if f.SHA256 != "" {
			ff.Source = fmt.Sprintf("hf://%s@%s/%s", h.repo, listing.Commit, f.Path)
		} else {
			// Kept in git: no sha256 from the Hub. Verified by size and by its git blob id
			// before it is renamed into place; content-addressed so a new commit that keeps
			// it keeps it.
			ff.Source = fmt.Sprintf("hf://%s/%s#git-blob=%s", h.repo, f.Path, f.BlobOID)
			if commitRE.MatchString(f.BlobOID) {
				ff.GitBlob = f.BlobOID
			}
		}
		t.files = append(t.files, ff)
	}
	if len(t.files) == 0 {
		return nil, fmt.Errorf("%s at %s has no file that include/exclude select (%d files listed)", h.repo, listing.Commit, len(listing.Files))
	}
	return t, nil
}

func mustURL(s string) *url.URL {
	u, _ := url.Parse(s) // validated in bind
	return u
}

// token reads the Hub token from token_file, else HF_TOKEN; it warns when the file is
// readable by group or others. The value is never printed.
func (d *Download) token() (string, []string, error) {
	if d.hub.tokenFile == "" {
		return strings.TrimSpace(d.getenv("HF_TOKEN")), nil, nil
	}
	fi, err := os.Stat(d.hub.tokenFile)
	if err != nil {
		return "", nil, fmt.Errorf("token_file: %w", err)
	}
	var warn []string
	if fi.Mode().Perm()&0o077 != 0 {
		warn = append(warn, fmt.Sprintf("token_file %s has mode %04o: readable by group or others; chmod 0600 it", d.hub.tokenFile, fi.Mode().Perm()))
	}
	data, err := os.ReadFile(d.hub.tokenFile)
	if err != nil {
		return "", nil, fmt.Errorf("token_file: %w", err)
	}
	return strings.TrimSpace(string(data)), warn, nil
}

// Check compares the destination with the files the plan wants, from the manifest and
// os.Stat alone: a converged download is confirmed without reading its data (and, pinned to
// a commit, without the network). Extra files are warnings; they are never deleted.
func (d *Download) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if d.Delete {
		return d.checkAbsent(env)
	}
	var prev downloadRecord
	if _, err := env.State.Load(&prev); err != nil {
		return nil, err
	}
	t, err := d.resolveTarget(ctx, env)
	if err != nil {
		return nil, err
	}
	if err := trust.Dir(d.dest); err != nil {
		return nil, fmt.Errorf("dest: %w", err)
	}
	res, err := fetch.Check(ctx, d.dest, t.files)
	if err != nil {
		return nil, err
	}
	diff := &agent.Diff{Warnings: t.warnings, Detail: &downloadDetail{files: t.files, listing: t.listing}}
	if t.fresh {
		// The listing (a fact about the remote) is recorded, so that the next run
		// needs no listing.
		rec := prev
		rec.Hub, rec.Dest = t.listing, d.dest
		diff.Record = agent.SaveRecord(&rec, fmt.Sprintf("the listing of %s at commit %s", t.listing.Repo, t.listing.Commit))
	}
	if _, err := os.Stat(d.dest); errors.Is(err, os.ErrNotExist) {
		diff.Add(agent.Added("dest", d.dest).Because(agent.Creates, agent.ReasonMissing))
	}
	if h := prev.Hub; d.hub != nil && h != nil && h.Endpoint == d.hub.endpoint && h.Repo == d.hub.repo &&
		h.Commit != t.listing.Commit && !res.Converged() {
		diff.Add(agent.Set("huggingface.commit", h.Commit, t.listing.Commit))
	}
	missing := 0
	for i, fs := range res.Files {
		f := t.files[i]
		if fs.State == fetch.StateOK {
			continue
		}
		attr := fmt.Sprintf("file[%q]", f.Name)
		size := "size unknown"
		if f.Size >= 0 {
			size = bytesize.Format(f.Size)
		}
		switch {
		case fs.State == fetch.StateVerify:
			diff.Add(agent.Change{Attr: attr, HasOld: true, HasNew: true, Old: agent.Raw(fs.Reason), New: agent.Raw("re-verify " + size), Note: "hashed, re-downloaded if wrong", Reason: agent.ReasonUnverified})
		case fs.Size >= 0:
			diff.Add(agent.Change{Attr: attr, HasOld: true, HasNew: true, Old: agent.Raw(fs.Reason), New: toDownload(f.Size, 0), Reason: agent.ReasonDiffers})
		case fs.Partial > 0:
			diff.Add(agent.Change{Attr: attr, HasNew: true, New: toDownload(f.Size, fs.Partial), Reason: agent.ReasonMissing})
		default:
			diff.Add(agent.Change{Attr: attr, HasNew: true, New: toDownload(f.Size, 0), Reason: agent.ReasonMissing})
		}
		missing++
	}
	diff.Warnings = append(diff.Warnings, extraWarnings(res.Extra)...)
	if missing == 0 {
		diff.Changes = nil
	}
	return diff.Derive(), nil
}

func extraWarnings(extra []string) []string {
	if len(extra) == 0 {
		return nil
	}
	const show = 10
	list := strings.Join(extra[:min(len(extra), show)], ", ")
	if len(extra) > show {
		list += fmt.Sprintf(" and %d more", len(extra)-show)
	}
	return []string{fmt.Sprintf("%d file(s) in dest are not part of this download and are kept: %s", len(extra), list)}
}

// Apply downloads what Check found missing (resuming partial files), verifies every file and
// records the Hub commit. Progress goes to the terminal when there is one, and to state
// (for `agent status` in another process) at most once a second.
func (d *Download) Apply(ctx context.Context, env *agent.Env, diff *agent.Diff) error {
	if d.Delete {
		return d.applyAbsent(env, diff)
	}
	det, ok := diff.Detail.(*downloadDetail)
	if !ok {
		return errors.New("internal error: no download detail")
	}
	files := det.files
	unverified := false
	tokenSent := false
	if d.hub != nil {
		token, _, err := d.token()
		if err != nil {
			return err
		}
		tokenSent = token != ""
		files = slices.Clone(files)
		for i := range files {
			if token != "" {
				// fetch sends it to this URL's own scheme and host:port only, never to the
				// CDN a redirect leads to.
				files[i].Header = http.Header{"Authorization": {"Bearer " + token}}
			}
			if files[i].SHA256 == "" && files[i].GitBlob == "" {
				unverified = true
			}
		}
	}
	files = withMirrors(files, d.mirrors)
	var rec downloadRecord
	if _, err := env.State.Load(&rec); err != nil {
		return err
	}
	if det.listing != nil {
		rec.Hub = det.listing
	}
	rep := newProgressReporter(env, &rec)
	opts := fetch.Options{
		Dest: d.dest, Concurrency: d.concurrency, Connections: d.connections, MaxConnections: d.maxConns,
		StallTimeout: d.stall, CheckpointEvery: d.checkpoint,
		Insecure: d.insecure, AllowUnverified: unverified, Progress: rep.update, ProgressInterval: 250 * time.Millisecond,
		Now: env.Now,
	}
	if err := trust.Dir(d.dest); err != nil {
		return fmt.Errorf("dest: %w", err)
	}
	res, ferr := fetch.Fetch(ctx, files, opts)
	rep.end()
	logSources(env, d.mirrors, res)
	if ferr != nil && d.hub != nil {
		ferr = hubFetchError(ferr, d.hub, tokenSent)
	}
	var errs []error
	if ferr != nil {
		failed := 0
		for _, fr := range res.Files {
			if fr.Err != nil {
				failed++
			}
		}
		errs = append(errs, fmt.Errorf("%d of %d files not in place (verified files are kept; a re-run resumes the rest): %w", failed, len(files), ferr))
	}
	rec.Progress, rec.Dest = nil, d.dest
	if err := env.State.Save(&rec); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Status reports files verified/total and bytes on disk/total from the manifest and a stat
// of the files and partial files (no data read), and, while an apply in another process is
// downloading, its bytes, rate and ETA per file from the progress it records in state.
func (d *Download) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	if d.Delete {
		return d.absentStatus(env)
	}
	var rec downloadRecord
	if _, err := env.State.Load(&rec); err != nil {
		return nil, err
	}
	t, err := d.resolveTarget(ctx, env)
	if err != nil {
		return nil, err
	}
	res, err := fetch.Check(ctx, d.dest, t.files)
	if err != nil {
		return nil, err
	}
	var verified, total, done int64
	for i, fs := range res.Files {
		f := t.files[i]
		switch {
		case f.Size >= 0:
			total += f.Size
		case fs.State == fetch.StateOK:
			total += fs.Size
		}
		if fs.State == fetch.StateOK {
			verified++
			done += fs.Size
		} else {
			done += fs.Partial
		}
	}
	n := int64(len(t.files))
	st := &agent.Status{Healthy: res.Converged(), Metrics: map[string]float64{
		"files_verified": float64(verified), "files_total": float64(n),
		"done_bytes": float64(done), "total_bytes": float64(total),
		// Deprecated names (the unit first), kept for one release: docs/service.md.
		"bytes_done": float64(done), "bytes_total": float64(total),
	}}
	st.Fields = append(st.Fields,
		agent.NumberField("files_verified", "files verified", verified).WithText(fmt.Sprintf("%d/%d", verified, n)),
		agent.BytesField("done_bytes", "bytes", done).WithText(fmt.Sprintf("%s / %s", bytesize.Format(done), bytesize.Format(total))),
		agent.TextField("dest", "dest", d.dest))
	if t.listing != nil {
		st.Fields = append(st.Fields, agent.TextField("commit", "commit", t.listing.Commit))
	}
	if len(res.Extra) > 0 {
		st.Fields = append(st.Fields, agent.NumberField("extra_files", "extra files", len(res.Extra)))
	}
	now := time.Now()
	if env.Now != nil {
		now = env.Now()
	}
	switch p := rec.Progress; {
	case st.Healthy:
		st.Summary = fmt.Sprintf("%d/%d files verified, %s", verified, n, bytesize.Format(done))
	case p.live(now):
		st.Summary = fmt.Sprintf("downloading (PID %d): %s / %s, %s/s, ETA %s", p.PID, bytesize.Format(p.Done), bytesize.Format(p.Total), bytesize.Format(int64(p.Rate)), etaString(p.ETASeconds))
		st.Metrics["done_bytes"], st.Metrics["bytes_done"] = float64(p.Done), float64(p.Done)
		st.Metrics["rate_bytes_per_second"] = p.Rate
		st.Metrics["eta_seconds"] = p.ETASeconds
		st.Fields = append(st.Fields,
			agent.NumberField("rate_bytes_per_second", "rate", p.Rate).WithText(bytesize.Format(int64(p.Rate))+"/s"),
			agent.NumberField("eta_seconds", "eta", p.ETASeconds).WithText(etaString(p.ETASeconds)))
		for _, f := range p.Files {
			st.Fields = append(st.Fields, agent.BytesField(fmt.Sprintf("done_bytes[%q]", f.Name), "file "+f.Name, f.Done).
				WithText(fmt.Sprintf("%s %s / %s, %s/s, ETA %s", f.State, bytesize.Format(f.Done), bytesize.Format(f.Total), bytesize.Format(int64(f.Rate)), etaString(f.ETASeconds))))
		}
	default:
		st.Summary = fmt.Sprintf("incomplete: %d/%d files verified, %s / %s on disk (an apply resumes it)", verified, n, bytesize.Format(done), bytesize.Format(total))
	}
	return st, nil
}

func etaString(sec float64) string {
	if sec < 0 {
		return "?"
	}
	return (time.Duration(sec) * time.Second).Round(time.Second).String()
}

// downloadSize is a file change's new value: what will be downloaded. --json writes the
// file's size in bytes (docs/json-output.md: sizes are bytes; -1 when the source does not
// say); people read "download 16.0 MiB (resume, 4.0 MiB on disk)".
type downloadSize struct{ size, partial int64 }

func toDownload(size, partial int64) downloadSize { return downloadSize{size, partial} }

func (d downloadSize) String() string {
	s := "download size unknown"
	if d.size >= 0 {
		s = "download " + bytesize.Format(d.size)
	}
	if d.partial > 0 {
		s += fmt.Sprintf(" (resume, %s on disk)", bytesize.Format(d.partial))
	}
	return s
}

func (d downloadSize) MarshalJSON() ([]byte, error) {
	return []byte(strconv.FormatInt(d.size, 10)), nil
}
