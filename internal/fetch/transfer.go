package fetch

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cavaliergopher/grab/v3"
)

// task is one file of a Fetch, with counters the progress reporter reads.
type task struct {
	f      File
	fr     *FileResult
	status FileStatus
	// single: fetch as one stream (the server ignored a range request).
	single bool
	// src is the URL asked now: a mirror's copy of the file, or the file's own URL.
	// f.URL stays the file's identity (sidecars) and the origin its Header goes to.
	src string
	// mirror: src is a mirror's (a failure moves on to the next source).
	mirror bool

	state atomic.Int32 // FileState
	done  atomic.Int64 // bytes in the partial file (or hashed while verifying)
	total atomic.Int64 // expected size, -1 unknown
	recv  atomic.Int64 // body bytes received in this call
	moved atomic.Int64 // bytes received or hashed: drives the rate
}

func newTask(f File, fr *FileResult) *task {
	t := &task{f: f, fr: fr}
	t.total.Store(f.Size)
	return t
}

func (t *task) setState(s FileState) { t.state.Store(int32(s)) }

// restartError means the partial file cannot be continued and the file starts over from zero.
type restartError struct{ reason string }

func (e *restartError) Error() string { return "restart from zero: " + e.reason }

// permanentError is not worth retrying (a full disk).
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// download transfers t's file into place from its mirrors, in order, then from its own URL:
// a mirror that misses the file, fails without sending a byte, or sends a file that does
// not verify is passed over for this file only. Bytes a mirror wrote before it failed are
// kept for the next source (the file's sha256 or git blob id judges them at the end, as it
// judges every byte); a file that does not verify is discarded whole.
func (r *run) download(ctx context.Context, t *task) error {
	for _, m := range t.f.Mirrors {
		t.src, t.mirror, t.single = m, true, false
		err := r.downloadFrom(ctx, t)
		if err == nil {
			t.fr.From = m
			return nil
		}
		var pe *permanentError
		if ctx.Err() != nil || errors.As(err, &pe) {
			return err // a full disk, a manifest that cannot be written: not the mirror's fault
		}
		if re := (*restartError)(nil); errors.As(err, &re) {
			err = fmt.Errorf("its copy is another version of the file: %s", re.reason)
		}
		t.fr.MirrorErrors = append(t.fr.MirrorErrors, fmt.Errorf("mirror %s: %w", redact(m), err))
	}
	t.src, t.mirror, t.single = t.f.URL, false, false
	before := t.recv.Load()
	err := r.downloadFrom(ctx, t)
	t.fr.OriginBytes = t.recv.Load() - before
	if err != nil {
		return err
	}
	t.fr.From = t.f.URL
	return nil
}

// downloadFrom transfers t's file from t.src, resuming and retrying as needed.
func (r *run) downloadFrom(ctx context.Context, t *task) error {
	l := layoutOf(t.f.Name)
	if l.dir != "." {
		if err := r.root.MkdirAll(l.dir, 0o755); err != nil {
			return fmt.Errorf("create directory: %w", err)
		}
	}
	realDir, err := r.realDir(filepath.Join(r.destAbs, l.dir))
	if err != nil {
		return err
	}
	partAbs := filepath.Join(realDir, filepath.Base(l.partial))
	t.setState(FileDownloading)
	release, err := r.acquire(ctx)
	if err != nil {
		return err
	}
	if r.useRanges(t) {
		release()
		if err := r.downloadPieces(ctx, t); !errors.Is(err, errNoRanges) {
			return err
		}
		if release, err = r.acquire(ctx); err != nil {
			return err
		}
	}
	defer release()

	restarts := 0
	budget := r.budget(t)
	for {
		st, err := r.loadPartial(t.f)
		if err != nil {
			return err
		}
		if st.from != t.src {
			// Bytes of another source: kept (the hash judges them), but its ETag says
			// nothing about this one.
			st.etag, st.from = "", t.src
		}
		if t.fr.Attempts == 0 {
			t.fr.ResumedFrom = st.off
		}
		t.fr.Attempts++
		t.done.Store(st.off)
		before := t.recv.Load()
		err = r.attempt(ctx, t, st, partAbs)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		var re *restartError
		var pe *permanentError
		switch {
		case errors.As(err, &re) && t.mirror:
			return err // this mirror's copy is not the file: the next source
		case errors.As(err, &re) && restarts <= r.opts.Retries:
			restarts++
			t.fr.Restarts++
			if err := r.discardPartial(t.f); err != nil {
				return err
			}
			continue
		case errors.As(err, &pe) || permanent(err):
			return err
		}
		if err := budget.next(ctx, err, t.recv.Load() > before, t.fr.Attempts); err != nil {
			return err
		}
	}
}

// attempt runs one grab transfer from st and, when it completes, verifies and renames the file.
func (r *run) attempt(ctx context.Context, t *task, st *partialState, partAbs string) (err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	last := newLastByte()
	stopWatch := r.watchStall(actx, cancel, last)
	defer stopWatch()

	req, err := grab.NewRequest(partAbs, t.src)
	if err != nil {
		return fmt.Errorf("request: %w", err)
	}
	req.NoCreateDirectories = true
	req.IgnoreRemoteTime = true
	req.BufferSize = copyBufferSize
	req.HTTPRequest.Header.Set("Accept-Encoding", "identity")
	if st.off > 0 && st.etag != "" && !strings.HasPrefix(st.etag, "W/") {
		req.HTTPRequest.Header.Set("If-Range", st.etag)
	}
	gotBody := false
	req.BeforeCopy = func(resp *grab.Response) error {
		gotBody = true
		return r.beforeCopy(t, st, resp)
	}
	req = req.WithContext(actx)

	hc, ft := r.httpClient(t, last)
	gc := &grab.Client{HTTPClient: hc, UserAgent: "agent-fetch", BufferSize: copyBufferSize}
	resp := gc.Do(req)
	err = resp.Err()
	var sc grab.StatusCodeError
	if se := ft.status.Load(); se != nil && errors.As(err, &sc) && int(sc) == se.Status {
		err = se // what the server said, not only its status
	}
	defer func() {
		if st.fd != nil {
			st.fd.Close()
			st.fd = nil
		}
	}()
	if err != nil {
		if cause := context.Cause(actx); errors.Is(cause, ErrStalled) && ctx.Err() == nil {
			err = fmt.Errorf("%w: no data for %s", ErrStalled, r.opts.StallTimeout)
		}
		var re *restartError
		if errors.As(err, &re) {
			return err
		}
		if errors.Is(err, grab.ErrBadLength) {
			return &restartError{reason: fmt.Sprintf("the server's size no longer matches the partial file (%v)", err)}
		}
		// Keep what streamed in so far: the next attempt (or the next agent) resumes here.
		if cerr := r.checkpoint(t.f, st); cerr != nil && !isDiskFull(err) {
			err = fmt.Errorf("%w (and %w)", err, cerr)
		}
		if isDiskFull(err) {
			return &permanentError{fmt.Errorf("%w: %w; %s keeps its checkpoint at %d bytes for a resume",
				ErrDiskFull, err, layoutOf(t.f.Name).partial, st.ckOff)}
		}
		return err
	}
	if !gotBody {
		// grab saw from a HEAD request that the partial file is already complete.
		if hr := resp.HTTPResponse; hr != nil {
			if etag := hr.Header.Get("ETag"); st.etag != "" && etag != st.etag {
				return &restartError{reason: fmt.Sprintf("ETag changed from %s to %s", st.etag, etag)}
			}
		}
	}
	return r.finish(t, st)
}

// beforeCopy validates the response grab is about to copy, and arms the hashing body.
func (r *run) beforeCopy(t *task, st *partialState, resp *grab.Response) error {
	hr := resp.HTTPResponse
	if ce := hr.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return fmt.Errorf("%w: server sent Content-Encoding %q though identity was asked for", ErrCompressed, ce)
	}
	etag := hr.Header.Get("ETag")
	if resp.DidResume {
		if local := resp.BytesComplete(); local != st.off {
			return &restartError{reason: fmt.Sprintf("partial file has %d bytes, checkpoint %d", local, st.off)}
		}
		switch hr.StatusCode {
		case http.StatusPartialContent:
		case http.StatusOK:
			return &restartError{reason: fmt.Sprintf("server answered a range request from byte %d with 200 and the whole file", st.off)}
		default:
			return fmt.Errorf("%w: status %s to a range request", ErrBadResponse, hr.Status)
		}
		start, end, total, err := parseContentRange(hr.Header.Get("Content-Range"))
		if err != nil {
			return fmt.Errorf("%w: %w", ErrBadResponse, err)
		}
		if start != st.off {
			return &restartError{reason: fmt.Sprintf("Content-Range starts at %d, partial file has %d bytes", start, st.off)}
		}
		if st.etag != "" && etag != st.etag {
			return &restartError{reason: fmt.Sprintf("ETag changed from %s to %s", st.etag, etag)}
		}
		if total < 0 || (st.size >= 0 && total != st.size) {
			return &restartError{reason: fmt.Sprintf("size changed from %d to %d", st.size, total)}
		}
		if end != total-1 {
			return fmt.Errorf("%w: Content-Range %q does not run to the end", ErrBadResponse, hr.Header.Get("Content-Range"))
		}
		if hr.ContentLength >= 0 && hr.ContentLength != end-start+1 {
			return fmt.Errorf("%w: Content-Length %d disagrees with Content-Range %q", ErrBadResponse, hr.ContentLength, hr.Header.Get("Content-Range"))
		}
		st.size = total
	} else {
		if hr.StatusCode != http.StatusOK {
			return fmt.Errorf("%w: status %s", ErrBadResponse, hr.Status)
		}
		if t.f.Size >= 0 && hr.ContentLength >= 0 && hr.ContentLength != t.f.Size {
			return fmt.Errorf("%w: server sends %d bytes, expected %d", ErrSize, hr.ContentLength, t.f.Size)
		}
		// grab truncates an existing partial file after this hook: start over. The server
		// does not resume (no ranges), so any partial file starts from zero: its sidecar
		// goes first, durably, so that no crash can pair the old hash state with new bytes.
		if st.off > 0 || st.ckOff > 0 {
			l := layoutOf(t.f.Name)
			if err := r.root.Remove(l.sidecar); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove sidecar: %w", err)
			}
			if err := r.syncDir(l.dir); err != nil {
				return fmt.Errorf("sync directory: %w", err)
			}
			t.fr.Restarts++
		}
		*st = partialState{h: sha256.New(), size: t.f.Size, etag: etag, from: t.src}
		if st.size < 0 {
			st.size = hr.ContentLength
		}
	}
	t.total.Store(st.size)
	t.done.Store(st.off)
	fd, err := r.root.OpenFile(layoutOf(t.f.Name).partial, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open partial file: %w", err)
	}
	st.fd = fd
	body, ok := hr.Body.(*hashBody)
	if !ok {
		return errNotInstalled
	}
	body.st = st
	return nil
}

// finish verifies the partial file and renames it into place: fsync, rename, fsync directory.
func (r *run) finish(t *task, st *partialState) error {
	l := layoutOf(t.f.Name)
	t.setState(FileVerifying)
	fi, err := r.root.Lstat(l.partial)
	if err != nil {
		return fmt.Errorf("stat partial file: %w", err)
	}
	sum := hex.EncodeToString(st.h.Sum(nil))
	if fi.Size() == st.off && st.size >= 0 && st.off < st.size {
		// The body ended early but cleanly (a close-delimited or chunked answer cut
		// short): what arrived is hashed and kept, and the next attempt resumes from it.
		if err := r.checkpoint(t.f, st); err != nil {
			return err
		}
		return fmt.Errorf("%w: the body ended after %d of %d bytes", io.ErrUnexpectedEOF, st.off, st.size)
	}
	var bad error
	switch {
	case fi.Size() != st.off:
		bad = fmt.Errorf("%w: partial file has %d bytes, %d were received", ErrSize, fi.Size(), st.off)
	case st.size >= 0 && st.off != st.size:
		bad = fmt.Errorf("%w: received %d bytes, expected %d", ErrSize, st.off, st.size)
	}
	if bad != nil {
		if err := r.discardPartial(t.f); err != nil {
			return fmt.Errorf("%w (and %w)", bad, err)
		}
		return bad
	}
	return r.verifyAndPlace(t, sum, st.off)
}

// verifyAndPlace checks the partial file of t, whose n bytes hashed to sum, against the
// expected size, sha256 and git blob id, and renames it into place: fsync, rename, fsync
// the directory, then the manifest entry. A wrong file is discarded, never put in place.
func (r *run) verifyAndPlace(t *task, sum string, n int64) error {
	l := layoutOf(t.f.Name)
	var bad error
	switch {
	case t.f.Size >= 0 && n != t.f.Size:
		bad = fmt.Errorf("%w: received %d bytes, expected %d", ErrSize, n, t.f.Size)
	case t.f.SHA256 != "" && sum != t.f.SHA256:
		bad = fmt.Errorf("%w: expected sha256 %s, got %s", ErrChecksum, t.f.SHA256, sum)
	case t.f.GitBlob != "":
		got, err := r.gitBlob(l.partial)
		if err != nil {
			return fmt.Errorf("git blob id of the partial file: %w", err)
		}
		if got != t.f.GitBlob {
			bad = fmt.Errorf("%w: expected git blob %s, got %s", ErrChecksum, t.f.GitBlob, got)
		}
	}
	if bad != nil {
		if err := r.discardPartial(t.f); err != nil {
			return fmt.Errorf("%w (and %w)", bad, err)
		}
		return bad
	}
	pf, err := r.root.OpenFile(l.partial, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = pf.Sync()
	if cerr := pf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync partial file: %w", err)
	}
	if err := r.root.Rename(l.partial, l.final); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	if err := r.syncDir(l.dir); err != nil {
		return fmt.Errorf("sync directory: %w", err)
	}
	for _, p := range []string{l.sidecar, l.live} {
		if err := r.root.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", p, err)
		}
	}
	if t.f.SHA256 == "" {
		sum = "" // unverified: record nothing we were not asked to check
	}
	e, err := r.record(t.f, sum)
	if err != nil {
		// The file is verified and in place; fetching it again would not help. The next
		// run finds it without a manifest entry and verifies it by reading it.
		return &permanentError{fmt.Errorf("%s is in place and verified, but recording it in the manifest failed: %w", t.f.Name, err)}
	}
	t.fr.Size, t.fr.SHA256 = e.Size, e.SHA256
	t.done.Store(e.Size)
	t.total.Store(e.Size)
	return nil
}

// gitBlob is git's object id of the file at name under the root:
// sha1("blob SIZE\x00" + content).
func (r *run) gitBlob(name string) (string, error) {
	f, err := r.root.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", fi.Size())
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// verifyExisting hashes a file already in place whose stat the manifest does not vouch for.
func (r *run) verifyExisting(ctx context.Context, t *task) (bool, error) {
	t.setState(FileVerifying)
	f, err := r.root.Open(layoutOf(t.f.Name).final)
	if err != nil {
		return false, nil
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, copyBufferSize)
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		k, err := f.Read(buf)
		h.Write(buf[:k])
		n += int64(k)
		t.done.Store(n)
		t.moved.Add(int64(k))
		if err == io.EOF {
			break
		}
		if err != nil {
			return false, fmt.Errorf("hash existing file: %w", err)
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if sum != t.f.SHA256 || (t.f.Size >= 0 && n != t.f.Size) {
		t.done.Store(0)
		return false, nil
	}
	e, err := r.record(t.f, sum)
	if err != nil {
		return false, err
	}
	t.fr.Size, t.fr.SHA256 = e.Size, e.SHA256
	return true, nil
}

// parseContentRange parses "bytes START-END/TOTAL" (TOTAL may be "*": -1).
func parseContentRange(v string) (start, end, total int64, err error) {
	bad := fmt.Errorf("bad Content-Range %q", v)
	spec, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, 0, 0, bad
	}
	rng, tot, ok := strings.Cut(spec, "/")
	if !ok {
		return 0, 0, 0, bad
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, bad
	}
	if start, err = strconv.ParseInt(a, 10, 64); err != nil || start < 0 {
		return 0, 0, 0, bad
	}
	if end, err = strconv.ParseInt(b, 10, 64); err != nil || end < start {
		return 0, 0, 0, bad
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil || total <= end {
			return 0, 0, 0, bad
		}
	}
	return start, end, total, nil
}

func isDiskFull(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// lastByte is when a body byte last arrived (or the attempt started), in Unix nanoseconds.
type lastByte struct{ ns atomic.Int64 }

func newLastByte() *lastByte {
	l := &lastByte{}
	l.touch()
	return l
}

func (l *lastByte) touch() { l.ns.Store(time.Now().UnixNano()) }

func (l *lastByte) since() time.Duration { return time.Since(time.Unix(0, l.ns.Load())) }

// watchStall cancels the attempt when no byte arrived for StallTimeout (connecting and
// waiting for headers included). The returned func stops it.
func (r *run) watchStall(ctx context.Context, cancel context.CancelCauseFunc, l *lastByte) func() {
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(min(max(r.opts.StallTimeout/4, time.Millisecond), time.Second))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if l.since() > r.opts.StallTimeout {
					cancel(ErrStalled)
					return
				}
			}
		}
	}()
	return func() { close(stop) }
}

// httpClient is the client grab uses for one attempt: the caller's client with its transport
// wrapped (identity encoding, per-origin headers, hashing body) and its redirects checked.
func (r *run) httpClient(t *task, last *lastByte) (*http.Client, *fileTransport) {
	c := *r.client
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	u, _ := url.Parse(t.f.URL) // validated before
	ft := &fileTransport{base: base, origin: origin(u), header: t.f.Header, r: r, t: t, last: last}
	c.Transport = ft
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return checkURL(req.URL, r.opts.Insecure || t.mirror)
	}
	return &c, ft
}

// fileTransport adds a file's headers only to requests for the file URL's own origin, asks
// for identity encoding, and wraps successful GET bodies in a hashBody.
type fileTransport struct {
	base   http.RoundTripper
	origin string
	header http.Header
	r      *run
	t      *task
	last   *lastByte
	// plain: hand bodies back as they are (the range workers hash from the page cache).
	plain bool
	// status is the last answer of 400 or more, with the server's words (grab keeps only
	// the status code).
	status atomic.Pointer[StatusError]
}

func (ft *fileTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	for k := range ft.header {
		out.Header.Del(k)
	}
	if origin(out.URL) == ft.origin {
		for k, vs := range ft.header {
			out.Header[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
		}
	}
	out.Header.Set("Accept-Encoding", "identity")
	resp, err := ft.base.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	ft.last.touch()
	if resp.StatusCode >= 400 {
		ft.status.Store(statusErrorOf(resp, ft.t.src))
	}
	if ft.plain {
		return resp, nil
	}
	if out.Method == http.MethodHead && headRefused(resp) {
		return ft.probe(out, resp)
	}
	if out.Method == http.MethodHead && transientStatus(resp.StatusCode) {
		// grab sends HEAD only to resume an existing partial file, and on any answer but
		// 200 it falls back to a plain GET, whose whole file would replace the partial.
		// A busy server is not a reason to throw away verified bytes: fail this attempt,
		// and the next one resumes.
		resp.Body.Close()
		return nil, fmt.Errorf("HEAD: %w (the partial file is kept for the next attempt)", ft.status.Load())
	}
	if out.Method == http.MethodGet && (resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent) {
		resp.Body = &hashBody{rc: resp.Body, r: ft.r, t: ft.t, last: ft.last}
	}
	return resp, nil
}

// transientStatus reports an answer that may well be different on the next try.
func transientStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests ||
		code >= 500 && code != http.StatusNotImplemented
}

// headRefused reports a HEAD answer that says nothing about ranges: the method refused
// (403, 405, 501), or a 200 without Accept-Ranges. grab learns whether it may resume only
// from HEAD, so such a server would otherwise lose every resume.
func headRefused(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusForbidden, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return true
	case http.StatusOK:
		return resp.Header.Get("Accept-Ranges") != "bytes"
	}
	return false
}

// probe answers grab's HEAD with what a one-byte range GET learns: a 206 becomes a 200 with
// Accept-Ranges, the total size and the ETag, so grab resumes with a Range request whose
// answer beforeCopy still checks in full. A redirect is passed on (the client follows it
// with another HEAD, probed again); anything else keeps the original HEAD answer.
func (ft *fileTransport) probe(head *http.Request, headResp *http.Response) (*http.Response, error) {
	req := head.Clone(head.Context())
	req.Method = http.MethodGet
	req.Header.Set("Range", "bytes=0-0")
	req.Header.Del("If-Range")
	resp, err := ft.base.RoundTrip(req)
	if err != nil {
		return headResp, nil
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		headResp.Body.Close()
		resp.Body = http.NoBody
		resp.Request = head
		return resp, nil
	case resp.StatusCode != http.StatusPartialContent:
		return headResp, nil
	}
	_, _, total, err := parseContentRange(resp.Header.Get("Content-Range"))
	if err != nil || total < 0 {
		return headResp, nil
	}
	headResp.Body.Close()
	h := resp.Header.Clone()
	h.Del("Content-Range")
	h.Set("Accept-Ranges", "bytes")
	h.Set("Content-Length", strconv.FormatInt(total, 10))
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
		Header: h, Body: http.NoBody, ContentLength: total, Request: head,
	}, nil
}
