package fetchtest

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault describes how a path misbehaves. The transient faults (DropAfter, Truncate, Corrupt,
// Stall, Gzip) apply to the first Times GET requests of the path after SetFault (every GET
// when Times is 0); the others are properties of the server and always apply.
type Fault struct {
	// Times limits the transfer faults to the first Times GET requests; 0 means all.
	Times int

	// DropAfter > 0 aborts the connection after this many body bytes of a response.
	DropAfter int64
	// IgnoreRange answers 200 with the whole body even when a range was asked for, while
	// still advertising Accept-Ranges (always on, not limited by Times).
	IgnoreRange bool
	// Truncate > 0 makes the response lie: Content-Length says Truncate (or less) and only
	// that many bytes are sent, while Content-Range, if any, still claims the full range.
	Truncate int64
	// Corrupt flips one byte of the body (same length, same ETag).
	Corrupt bool
	// Stall > 0 stops sending for Stall after StallAfter body bytes (or until the client
	// goes away).
	Stall      time.Duration
	StallAfter int64
	// Gzip encodes the body with Content-Encoding: gzip whatever the client asked for.
	Gzip bool

	// ChangeAfter > 0 replaces the content with Next (and a new ETag) once ChangeAfter GET
	// requests have been served.
	ChangeAfter int
	Next        []byte
	// IgnoreIfRange serves the asked range even when If-Range names an older ETag.
	IgnoreIfRange bool

	// RedirectTo, when set, answers every request that passes the Authorization checks
	// with 302 to RedirectTo + the path.
	RedirectTo string
	// RequireAuth answers 401 unless the Authorization header equals it.
	RequireAuth string
	// DenyAuth answers 403 to any request that carries an Authorization header.
	DenyAuth bool
	// RefuseHEAD answers 405 to HEAD requests, as some object stores and proxies do.
	RefuseHEAD bool
	// BusyHEAD answers the first BusyHEAD HEAD requests with 503, as a loaded server or
	// CDN edge does now and then.
	BusyHEAD int
	// HEADNoLength answers HEAD with 200 and no Content-Length, as servers that would
	// stream the body chunked do.
	HEADNoLength bool

	// EndCleanlyAfter > 0 sends no Content-Length and closes the connection cleanly after
	// this many body bytes: a close-delimited body cut short, which the client reads as
	// a normal end of the body.
	EndCleanlyAfter int64
	// Overflow > 0 sends no Content-Length (chunked) and this many more bytes after the
	// body, as a broken or hostile server would.
	Overflow int64

	// The CDN's manners (always on, not limited by Times):

	// Rate > 0 caps each response (each connection: one request at a time) at Rate body
	// bytes per second, as model CDNs cap a connection.
	Rate int64
	// Congested > 0 paces every answer on the first Congested connections that GET the
	// path at CongestedRate instead (one CDN edge congested, the others not): a client
	// that waits for its slowest connection finishes at that rate. A later connection is
	// not congested.
	Congested     int
	CongestedRate int64
	// FirstByteDelay delays each GET's headers, as a CDN's time to first byte.
	FirstByteDelay time.Duration
	// MaxRange > 0 answers a range request with at most MaxRange bytes (an honest
	// Content-Range that ends early): the client must ask for the rest.
	MaxRange int64
	// Busy > 0 answers the first Busy GETs with BusyStatus (default 503) and, when set,
	// a Retry-After header.
	Busy       int
	BusyStatus int
	RetryAfter string
	// StallAt lists file offsets: a GET whose body would cross one stops there and holds
	// until the client goes away (a kill test's fixed points).
	StallAt []int64

	// SignedBytes > 0 or SignedFor > 0 emulate a Hub that redirects each request for the
	// path (without a signature) with 302 to a signed CDN URL (path?sig=N) that expires
	// after SignedBytes body bytes sent through it, or SignedFor after it was issued. A
	// response that reaches the expiry mid-body is cut (the connection closes); a later
	// request with an expired signature gets 403, as a CDN's expired signed URL does.
	SignedBytes int64
	SignedFor   time.Duration
}

// Stats counts what a path was asked for and what it sent.
type Stats struct {
	Requests  int   // all requests
	GETs      int   // GET requests
	HEADs     int   // HEAD requests
	RangeGETs int   // GET requests with a Range header
	AuthSeen  int   // requests that carried an Authorization header
	BytesSent int64 // body bytes written to clients
	// InFlight is how many GETs are being answered now; MaxInFlight the most at once.
	InFlight, MaxInFlight int
	Busy                  int // GETs answered with BusyStatus
	CongestedGETs         int // GETs answered at CongestedRate
	Signed                int // signed URLs issued (redirects)
	Expired               int // requests refused or cut because their signature expired
}

type entry struct {
	content []byte
	etag    string
	fault   Fault
	faulted int // GETs served since SetFault
	swapped bool
	stats   Stats
	sigs    map[string]*signature
	conns   map[string]int // client address -> order of its first GET
}

// signature is one signed URL the emulated Hub issued.
type signature struct {
	sent    int64 // body bytes sent through it
	expires time.Time
}

func (sg *signature) expired(f Fault) bool {
	return (f.SignedBytes > 0 && sg.sent >= f.SignedBytes) || (f.SignedFor > 0 && time.Now().After(sg.expires))
}

// Server is an httptest server over in-memory files. Its methods are safe for concurrent use.
type Server struct {
	srv   *httptest.Server
	mu    sync.Mutex
	files map[string]*entry
}

// NewServer starts a server on a loopback address. Close it when done.
func NewServer() *Server {
	s := &Server{files: make(map[string]*entry)}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// Close shuts the server down, interrupting stalled responses.
func (s *Server) Close() {
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// URL returns the URL of path (which starts with "/"), or the base URL for "".
func (s *Server) URL(path string) string { return s.srv.URL + path }

// Set serves content at path with an ETag derived from it, keeping any fault.
func (s *Server) Set(path string, content []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.files[path]
	if e == nil {
		e = &entry{}
		s.files[path] = e
	}
	e.content = content
	e.etag = ETag(content)
}

// SetFault sets the fault of path and restarts its Times count.
func (s *Server) SetFault(path string, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.files[path]
	if e == nil {
		e = &entry{}
		s.files[path] = e
	}
	e.fault = f
	e.faulted = 0
	e.swapped = false
}

// Stats returns the counters of path.
func (s *Server) Stats(path string) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.files[path]; e != nil {
		return e.stats
	}
	return Stats{}
}

// ETag is the strong ETag the server gives content.
func ETag(content []byte) string {
	sum := sha256.Sum256(content)
	return `"` + hex.EncodeToString(sum[:8]) + `"`
}

// plan is what one request will get, decided under the lock.
type plan struct {
	content []byte
	etag    string
	fault   Fault // transfer faults zeroed when they do not apply
	sig     *signature
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	e := s.files[r.URL.Path]
	if e == nil {
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	e.stats.Requests++
	if r.Header.Get("Authorization") != "" {
		e.stats.AuthSeen++
	}
	f := e.fault
	sig, ok := s.admit(w, r, e, f)
	if !ok {
		return
	}
	switch r.Method {
	case http.MethodHead:
		e.stats.HEADs++
		if f.RefuseHEAD {
			s.mu.Unlock()
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if e.stats.HEADs <= f.BusyHEAD {
			s.mu.Unlock()
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
	case http.MethodGet:
		e.stats.GETs++
		if r.Header.Get("Range") != "" {
			e.stats.RangeGETs++
		}
		if e.stats.GETs <= f.Busy {
			e.stats.Busy++
			s.mu.Unlock()
			if f.RetryAfter != "" {
				w.Header().Set("Retry-After", f.RetryAfter)
			}
			code := f.BusyStatus
			if code == 0 {
				code = http.StatusServiceUnavailable
			}
			http.Error(w, "slow down", code)
			return
		}
		if e.conns == nil {
			e.conns = map[string]int{}
		}
		if _, ok := e.conns[r.RemoteAddr]; !ok {
			e.conns[r.RemoteAddr] = len(e.conns)
		}
		if e.conns[r.RemoteAddr] < f.Congested {
			f.Rate = f.CongestedRate
			e.stats.CongestedGETs++
		}
		if f.ChangeAfter > 0 && !e.swapped && e.stats.GETs > f.ChangeAfter {
			e.content, e.etag, e.swapped = f.Next, ETag(f.Next), true
		}
		e.faulted++
	default:
		s.mu.Unlock()
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	p := plan{content: e.content, etag: e.etag, fault: f, sig: sig}
	if r.Method != http.MethodGet || (f.Times > 0 && e.faulted > f.Times) {
		p.fault.DropAfter, p.fault.Truncate = 0, 0
		p.fault.Corrupt, p.fault.Stall, p.fault.Gzip = false, 0, false
		p.fault.EndCleanlyAfter, p.fault.Overflow = 0, 0
	}
	if r.Method == http.MethodGet {
		e.stats.InFlight++
		e.stats.MaxInFlight = max(e.stats.MaxInFlight, e.stats.InFlight)
		defer func() {
			s.mu.Lock()
			e.stats.InFlight--
			s.mu.Unlock()
		}()
	}
	s.mu.Unlock()
	if f.FirstByteDelay > 0 && r.Method == http.MethodGet {
		t := time.NewTimer(f.FirstByteDelay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	s.respond(w, r, e, p)
}

// admit answers, with s.mu held, what f refuses before any body: a header it denies or
// requires, a redirect, a signature to hand out or one expired (ok false: answered, and
// s.mu released). sig is the request's signature when f signs its URLs.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, e *entry, f Fault) (sig *signature, ok bool) {
	if f.DenyAuth && r.Header.Get("Authorization") != "" {
		s.mu.Unlock()
		http.Error(w, "authorization not accepted here", http.StatusForbidden)
		return nil, false
	}
	if f.RequireAuth != "" && r.Header.Get("Authorization") != f.RequireAuth {
		s.mu.Unlock()
		http.Error(w, "authorization required", http.StatusUnauthorized)
		return nil, false
	}
	if f.RedirectTo != "" {
		s.mu.Unlock()
		http.Redirect(w, r, f.RedirectTo+r.URL.Path, http.StatusFound)
		return nil, false
	}
	if f.SignedBytes > 0 || f.SignedFor > 0 {
		key := r.URL.Query().Get("sig")
		if key == "" {
			e.stats.Signed++
			key = strconv.Itoa(e.stats.Signed)
			if e.sigs == nil {
				e.sigs = map[string]*signature{}
			}
			e.sigs[key] = &signature{expires: time.Now().Add(f.SignedFor)}
			s.mu.Unlock()
			http.Redirect(w, r, r.URL.Path+"?sig="+key, http.StatusFound)
			return nil, false
		}
		sig = e.sigs[key]
		if sig == nil || sig.expired(f) {
			e.stats.Expired++
			s.mu.Unlock()
			http.Error(w, "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>", http.StatusForbidden)
			return nil, false
		}
	}
	return sig, true
}

func (s *Server) respond(w http.ResponseWriter, r *http.Request, e *entry, p plan) {
	h := w.Header()
	h.Set("ETag", p.etag)
	h.Set("Accept-Ranges", "bytes")
	size := int64(len(p.content))
	start, end, ranged := int64(0), size-1, false
	if rh := r.Header.Get("Range"); rh != "" && !p.fault.IgnoreRange {
		ifr := r.Header.Get("If-Range")
		if ifr == "" || ifr == p.etag || p.fault.IgnoreIfRange {
			st, en, ok := parseRange(rh, size)
			if !ok {
				h.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
				http.Error(w, "range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
				return
			}
			start, end, ranged = st, en, true
			if p.fault.MaxRange > 0 && end-start+1 > p.fault.MaxRange {
				end = start + p.fault.MaxRange - 1
			}
		}
	}
	body := p.content[start : end+1]
	if p.fault.Corrupt && len(body) > 0 {
		body = append([]byte(nil), body...)
		body[len(body)/2] ^= 0xff
	}
	status := http.StatusOK
	if ranged {
		status = http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, size))
	}
	if p.fault.Truncate > 0 && int64(len(body)) > p.fault.Truncate {
		body = body[:p.fault.Truncate]
	}
	if r.Method == http.MethodHead {
		if !p.fault.HEADNoLength {
			h.Set("Content-Length", strconv.FormatInt(int64(len(body)), 10))
		}
		w.WriteHeader(status)
		return
	}
	cw := &countingWriter{w: w, s: s, e: e, sig: p.sig, fault: p.fault}
	if p.fault.Gzip {
		h.Set("Content-Encoding", "gzip")
		w.WriteHeader(status)
		zw := gzip.NewWriter(cw)
		_, _ = zw.Write(body)
		_ = zw.Close()
		return
	}
	if p.fault.EndCleanlyAfter > 0 {
		s.endCleanly(w, status, body[:min(p.fault.EndCleanlyAfter, int64(len(body)))], e)
		return
	}
	if p.fault.Overflow > 0 {
		w.WriteHeader(status) // no Content-Length: chunked
		_, _ = cw.Write(body)
		junk := make([]byte, 32<<10)
		for n := int64(0); n < p.fault.Overflow; n += int64(len(junk)) {
			if _, err := cw.Write(junk); err != nil {
				return
			}
		}
		return
	}
	s.stream(w, r, cw, body, start, status, p.fault)
}

// stream sends body (the bytes from start) at f's rate, with f's stalls and drop.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, cw *countingWriter, body []byte, start int64, status int, f Fault) {
	h := w.Header()
	h.Set("Content-Length", strconv.FormatInt(int64(len(body)), 10))
	w.WriteHeader(status)
	var sent int64
	began := time.Now()
	send := func(upto int64) bool {
		if upto > int64(len(body)) {
			upto = int64(len(body))
		}
		for sent < upto {
			n := min(upto-sent, 32<<10)
			if f.Rate > 0 {
				n = min(n, max(f.Rate/64, 1))
				if d := time.Until(began.Add(time.Duration(float64(sent) / float64(f.Rate) * float64(time.Second)))); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-t.C:
					case <-r.Context().Done():
						t.Stop()
						return false
					}
				}
			}
			k, err := cw.Write(body[sent : sent+n])
			sent += int64(k)
			if err != nil {
				if errors.Is(err, errExpired) {
					w.(http.Flusher).Flush()
					panic(http.ErrAbortHandler)
				}
				return false
			}
		}
		return true
	}
	for _, at := range f.StallAt {
		if rel := at - start; rel >= 0 && rel < int64(len(body)) {
			if !send(rel) {
				return
			}
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
	}
	if f.Stall > 0 {
		if !send(f.StallAfter) {
			return
		}
		w.(http.Flusher).Flush()
		t := time.NewTimer(f.Stall)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	}
	if f.DropAfter > 0 {
		send(f.DropAfter)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	send(int64(len(body)))
}

// endCleanly writes a close-delimited response (no Content-Length, no chunking) with
// body, then closes the connection: the client sees a clean end of a short body.
func (s *Server) endCleanly(w http.ResponseWriter, status int, body []byte, e *entry) {
	conn, bw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nConnection: close\r\n", status, http.StatusText(status))
	for k, vs := range w.Header() {
		for _, v := range vs {
			fmt.Fprintf(bw, "%s: %s\r\n", k, v)
		}
	}
	bw.WriteString("\r\n")
	n, _ := bw.Write(body)
	bw.Flush()
	s.mu.Lock()
	e.stats.BytesSent += int64(n)
	s.mu.Unlock()
}

// parseRange parses a single "bytes=a-b", "bytes=a-" or "bytes=-n" range.
func parseRange(v string, size int64) (start, end int64, ok bool) {
	spec, found := strings.CutPrefix(v, "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	a, b, found := strings.Cut(spec, "-")
	if !found {
		return 0, 0, false
	}
	if a == "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false
		}
		return max(size-n, 0), size - 1, size > 0
	}
	start, err := strconv.ParseInt(a, 10, 64)
	if err != nil || start < 0 || start >= size {
		return 0, 0, false
	}
	end = size - 1
	if b != "" {
		e, err := strconv.ParseInt(b, 10, 64)
		if err != nil || e < start {
			return 0, 0, false
		}
		end = min(e, size-1)
	}
	return start, end, true
}

// errExpired: the signed URL a response was sent through expired mid-body.
var errExpired = errors.New("signature expired")

type countingWriter struct {
	w     http.ResponseWriter
	s     *Server
	e     *entry
	sig   *signature
	fault Fault
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.s.mu.Lock()
	if c.sig != nil {
		if c.sig.expired(c.fault) {
			c.e.stats.Expired++
			c.s.mu.Unlock()
			return 0, errExpired
		}
		if c.fault.SignedBytes > 0 {
			p = p[:min(int64(len(p)), c.fault.SignedBytes-c.sig.sent)]
		}
	}
	c.s.mu.Unlock()
	n, err := c.w.Write(p)
	c.s.mu.Lock()
	c.e.stats.BytesSent += int64(n)
	if c.sig != nil {
		c.sig.sent += int64(n)
	}
	c.s.mu.Unlock()
	return n, err
}
