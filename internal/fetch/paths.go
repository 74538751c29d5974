package fetch

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	manifestName  = ".agent-manifest.json"
	lockName      = ".agent-fetch.lock"
	partialSuffix = ".partial"
	sidecarSuffix = ".partial.json"
	liveSuffix    = ".partial.live"
	tmpSuffix     = ".tmp"
)

// validate checks names, URLs and digests before anything touches the disk or the network.
func validate(files []File, opts Options) error {
	seen := make(map[string]bool, len(files))
	for _, f := range files {
		if err := checkName(f.Name); err != nil {
			return err
		}
		if seen[f.Name] {
			return fmt.Errorf("file %q is named twice", f.Name)
		}
		seen[f.Name] = true
		u, err := url.Parse(f.URL)
		if err != nil {
			return fmt.Errorf("file %q: url: %w", f.Name, err)
		}
		if err := checkURL(u, opts.Insecure); err != nil {
			return fmt.Errorf("file %q: %w", f.Name, err)
		}
		if f.SHA256 == "" && f.GitBlob == "" && !opts.AllowUnverified {
			return fmt.Errorf("file %q: %w (set one, or allow unverified files)", f.Name, ErrUnverified)
		}
		if f.GitBlob != "" {
			if b, err := hex.DecodeString(f.GitBlob); err != nil || len(b) != 20 || strings.ToLower(f.GitBlob) != f.GitBlob {
				return fmt.Errorf("file %q: git blob %q is not 40 lower-case hex digits", f.Name, f.GitBlob)
			}
		}
		if f.SHA256 != "" {
			if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != 32 || strings.ToLower(f.SHA256) != f.SHA256 {
				return fmt.Errorf("file %q: sha256 %q is not 64 lower-case hex digits", f.Name, f.SHA256)
			}
		}
		if f.Size < -1 {
			return fmt.Errorf("file %q: size %d (use -1 for unknown)", f.Name, f.Size)
		}
		if len(f.Mirrors) > 0 && f.SHA256 == "" && f.GitBlob == "" {
			return fmt.Errorf("file %q: %w: a mirror's copy is trusted only once it matches a sha256 or git blob id that did not come from the mirror", f.Name, ErrUnverified)
		}
		for _, m := range f.Mirrors {
			if err := checkMirror(m); err != nil {
				return fmt.Errorf("file %q: %w", f.Name, err)
			}
		}
	}
	return nil
}

// checkName refuses names that are not a clean relative path inside Dest, or that collide with
// the files this package keeps there.
func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty name", ErrUnsafeName)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("%w: %q contains a NUL byte", ErrUnsafeName, name)
	case path.IsAbs(name) || filepath.IsAbs(name):
		return fmt.Errorf("%w: %q is absolute; names are relative to the destination", ErrUnsafeName, name)
	case !filepath.IsLocal(name):
		return fmt.Errorf("%w: %q leaves the destination", ErrUnsafeName, name)
	case path.Clean(name) != name || strings.Contains(name, `\`):
		return fmt.Errorf("%w: %q is not a clean slash-separated path (want %q)", ErrUnsafeName, name, path.Clean(filepath.ToSlash(name)))
	}
	for _, elem := range strings.Split(name, "/") {
		if elem == ".." || elem == "." {
			return fmt.Errorf("%w: %q leaves the destination", ErrUnsafeName, name)
		}
	}
	if Own(name) {
		return fmt.Errorf("%w: %q collides with the files fetch keeps in the destination", ErrUnsafeName, name)
	}
	return nil
}

// checkURL allows https, and http only to loopback hosts or when insecure.
func checkURL(u *url.URL, insecure bool) error {
	switch strings.ToLower(u.Scheme) {
	case "https":
		if u.Host == "" {
			return fmt.Errorf("url %q has no host", u.Redacted())
		}
		return nil
	case "http":
		if insecure || isLoopback(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("%w: %q uses plain http to a non-loopback host", ErrInsecureURL, u.Redacted())
	default:
		return fmt.Errorf("%w: %q: only https (or http to loopback) is fetched", ErrInsecureURL, u.Redacted())
	}
}

// checkMirror allows http and https to any host: what a mirror sends is verified against a
// hash it did not provide before it is used, so a LAN mirror needs no certificate.
func checkMirror(m string) error {
	u, err := url.Parse(m)
	switch {
	case err != nil:
		return fmt.Errorf("mirror: %w", err)
	case !strings.EqualFold(u.Scheme, "http") && !strings.EqualFold(u.Scheme, "https"):
		return fmt.Errorf("%w: mirror %q: only http and https", ErrInsecureURL, u.Redacted())
	case u.Host == "":
		return fmt.Errorf("mirror %q has no host", u.Redacted())
	}
	return nil
}

// redact is a URL fit for an error: no password, no query (a signed URL's query is a
// credential).
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(an unparsable URL)"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.Redacted()
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// origin is a URL's scheme and host:port, lower-cased with the default port filled in.
func origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// layout holds a file's paths relative to Dest (OS separators).
type layout struct {
	final, partial, sidecar, live, dir string
}

func layoutOf(name string) layout {
	rel := filepath.FromSlash(name)
	dir, base := filepath.Split(rel)
	dir = filepath.Clean(dir)
	return layout{
		final:   rel,
		partial: filepath.Join(dir, "."+base+partialSuffix),
		sidecar: filepath.Join(dir, "."+base+sidecarSuffix),
		live:    filepath.Join(dir, "."+base+liveSuffix),
		dir:     dir,
	}
}

// run is the state of one Fetch call.
type run struct {
	opts     Options
	destAbs  string // as given, absolute
	destReal string // with symlinks resolved
	root     *os.Root
	client   *http.Client
	ownTrans *http.Transport // closed at the end when we made it

	manMu sync.Mutex
	man   *manifest

	slots chan struct{} // one per connection in use (Options.MaxConnections)
}

func newRun(destAbs string, opts Options) (*run, error) {
	real, err := filepath.EvalSymlinks(destAbs)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(destAbs)
	if err != nil {
		return nil, err
	}
	r := &run{opts: opts, destAbs: destAbs, destReal: real, root: root, client: opts.Client,
		slots: make(chan struct{}, max(opts.MaxConnections, 1))}
	if r.client == nil {
		r.ownTrans = http.DefaultTransport.(*http.Transport).Clone()
		// Range workers come back to the same hosts: keep their connections for the
		// next piece instead of a new handshake each time.
		r.ownTrans.MaxIdleConnsPerHost = max(opts.MaxConnections, 2)
		r.client = &http.Client{Transport: r.ownTrans}
	}
	return r, nil
}

func (r *run) close() {
	if r.ownTrans != nil {
		r.ownTrans.CloseIdleConnections()
	}
	r.root.Close()
}

// checkResolved refuses a name whose existing parent directories resolve, through a symlink,
// to a place outside Dest. Missing directories are created later through r.root, which cannot
// leave Dest.
func (r *run) checkResolved(name string) error {
	dir := layoutOf(name).dir
	if dir == "." {
		return nil
	}
	p := r.destAbs
	for _, elem := range strings.Split(dir, string(filepath.Separator)) {
		p = filepath.Join(p, elem)
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("file %q: %w", name, err)
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			if !fi.IsDir() {
				return fmt.Errorf("file %q: %s is not a directory", name, p)
			}
			continue
		}
		if _, err := r.realDir(p); err != nil {
			return fmt.Errorf("file %q: %w", name, err)
		}
	}
	return nil
}

// realDir resolves p and makes sure it stays inside Dest.
func (r *run) realDir(p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	if real != r.destReal && !strings.HasPrefix(real, r.destReal+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: %s resolves to %s, outside the destination %s", ErrUnsafeName, p, real, r.destReal)
	}
	return real, nil
}

// lock takes an exclusive, non-blocking flock on Dest's lock file.
func (r *run) lock() (func(), error) {
	f, err := r.root.OpenFile(lockName, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", r.destAbs, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, r.destAbs)
		}
		return nil, fmt.Errorf("lock %s: %w", r.destAbs, err)
	}
	return func() { f.Close() }, nil
}

// syncDir fsyncs a directory under Dest so a rename in it is durable.
func (r *run) syncDir(dir string) error {
	d, err := r.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// writeFileAtomic writes data to rel under Dest: temp file, fsync, rename, fsync directory.
func writeFileAtomic(root *os.Root, rel string, data []byte, perm os.FileMode, syncDir bool) error {
	tmp := rel + tmpSuffix
	f, err := root.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		root.Remove(tmp)
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		root.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		root.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		root.Remove(tmp)
		return err
	}
	if err := root.Rename(tmp, rel); err != nil {
		root.Remove(tmp)
		return err
	}
	if !syncDir {
		return nil
	}
	d, err := root.Open(filepath.Dir(rel))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
