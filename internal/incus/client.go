package incus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// DefaultOperationTimeout caps how long a call waits for a background
// operation (and how long a plain request may take) when the caller's context
// has no earlier deadline.
const DefaultOperationTimeout = 10 * time.Minute

// maxResponseBytes bounds a JSON response body; Incus answers are small.
const maxResponseBytes = 32 << 20

// Default socket locations, in the order SocketPath tries them.
var defaultSockets = [...]string{"/var/lib/incus/unix.socket", "/run/incus/unix.socket"}

// SocketPath resolves the Incus unix socket: the explicit value when set, then
// $INCUS_SOCKET, then the first of /var/lib/incus/unix.socket and
// /run/incus/unix.socket that exists. When none exists it returns the first
// default, so that the error of the first request names a path.
func SocketPath(explicit string) string {
	return socketPath(explicit, os.Getenv("INCUS_SOCKET"), defaultSockets[:])
}

func socketPath(explicit, env string, candidates []string) string {
	if explicit != "" {
		return explicit
	}
	if env != "" {
		return env
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return candidates[0]
}

// Client talks to one Incus daemon over its unix socket. It is safe for
// concurrent use.
type Client struct {
	socket    string
	http      *http.Client
	opTimeout time.Duration
}

// New returns a client for the daemon listening on socketPath. No connection
// is made until the first call.
func New(socketPath string) *Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConns:          8,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 0, // long-poll waits; bounded by contexts instead
		DisableCompression:    true,
	}
	return &Client{
		socket:    socketPath,
		http:      &http.Client{Transport: tr},
		opTimeout: DefaultOperationTimeout,
	}
}

// WithOperationTimeout returns a copy of c whose waits (and plain requests
// without a context deadline) are capped at d instead of
// DefaultOperationTimeout. The copy shares c's connections.
func (c *Client) WithOperationTimeout(d time.Duration) *Client {
	cp := *c
	if d > 0 {
		cp.opTimeout = d
	}
	return &cp
}

// Socket is the unix socket path the client dials.
func (c *Client) Socket() string { return c.socket }

// Error is an error answer of the Incus API (or a non-2xx HTTP reply).
type Error struct {
	Method  string // request method
	Path    string // request path, without the query
	Status  int    // HTTP status (Incus' error_code when it gave one)
	Message string // Incus' error text
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("incus: %s %s: %s (HTTP %d)", e.Method, e.Path, msg, e.Status)
}

// IsNotFound reports whether err is (or wraps) an Incus 404 answer.
func IsNotFound(err error) bool { return HasStatus(err, http.StatusNotFound) }

// HasStatus reports whether err is (or wraps) an Incus answer with the given
// HTTP status, e.g. http.StatusPreconditionFailed for a stale ETag.
func HasStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// response is the envelope of every Incus JSON answer.
type response struct {
	Type       string          `json:"type"`
	Status     string          `json:"status"`
	StatusCode int             `json:"status_code"`
	Operation  string          `json:"operation"`
	ErrorCode  int             `json:"error_code"`
	Error      string          `json:"error"`
	Metadata   json.RawMessage `json:"metadata"`
}

// Response types.
const (
	typeSync  = "sync"
	typeAsync = "async"
	typeError = "error"
)

// decodeResponse parses an Incus envelope and checks that it is one of the
// three documented kinds.
func decodeResponse(data []byte) (*response, error) {
	var r response
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode response: %w", err)
	}
	switch r.Type {
	case typeSync, typeAsync:
	case typeError:
		if r.Error == "" {
			r.Error = "unknown error"
		}
	default:
		return nil, fmt.Errorf("decode response: unknown type %q", r.Type)
	}
	if r.Type == typeAsync && r.Operation == "" {
		return nil, errors.New("decode response: async response without operation")
	}
	return &r, nil
}

// metadata decodes the envelope's metadata into v.
func (r *response) metadata(v any) error {
	if len(r.Metadata) == 0 || string(r.Metadata) == "null" {
		return errors.New("response has no metadata")
	}
	if err := json.Unmarshal(r.Metadata, v); err != nil {
		return fmt.Errorf("decode metadata: %w", err)
	}
	return nil
}

// request describes one API call.
type request struct {
	method string
	path   string // escaped path, e.g. /1.0/instances/c1
	query  url.Values
	body   any // nil, io.Reader (sent raw) or a value encoded as JSON
	header http.Header
}

func (r request) String() string { return r.method + " " + r.path }

// send performs the HTTP exchange and returns the raw reply. A non-2xx reply
// is turned into *Error and its body closed.
func (c *Client) send(ctx context.Context, req request) (*http.Response, error) {
	var body io.Reader
	contentType := ""
	switch b := req.body.(type) {
	case nil:
	case io.Reader:
		body = b
		contentType = "application/octet-stream"
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("incus: %s: encode body: %w", req, err)
		}
		body = bytes.NewReader(data)
		contentType = "application/json"
	}
	u, err := url.Parse("http://incus" + req.path)
	if err != nil || u.Host != "incus" {
		return nil, fmt.Errorf("incus: %s: invalid path", req)
	}
	if req.query != nil {
		u.RawQuery = req.query.Encode()
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("incus: %s: %w", req, err)
	}
	if contentType != "" {
		hr.Header.Set("Content-Type", contentType)
	}
	for k, vs := range req.header {
		hr.Header[http.CanonicalHeaderKey(k)] = vs
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, fmt.Errorf("incus: %s (socket %s): %w", req, c.socket, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
		return nil, errorFromBody(req, resp.StatusCode, data)
	}
	return resp, nil
}

// errorFromBody builds the *Error for a non-2xx reply.
func errorFromBody(req request, status int, data []byte) *Error {
	e := &Error{Method: req.method, Path: req.path, Status: status}
	if r, err := decodeResponse(data); err == nil && r.Type == typeError {
		e.Message = r.Error
	} else {
		e.Message = strings.TrimSpace(string(data))
		if len(e.Message) > 512 {
			e.Message = e.Message[:512] + "…"
		}
	}
	return e
}

// do performs a request whose answer is a JSON envelope. Plain requests
// without a context deadline are capped at the operation timeout. An error
// envelope becomes *Error.
func (c *Client) do(ctx context.Context, req request) (*response, http.Header, error) {
	r, hdr, err := c.roundTrip(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	if r.Type == typeError {
		return nil, nil, &Error{Method: req.method, Path: req.path, Status: r.ErrorCode, Message: r.Error}
	}
	return r, hdr, nil
}

// roundTrip is do without the last step: an error envelope that came with a
// 2xx HTTP status is returned as an envelope (the wait endpoint answers that
// way), its ErrorCode defaulting to the HTTP status.
func (c *Client) roundTrip(ctx context.Context, req request) (*response, http.Header, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opTimeout)
		defer cancel()
	}
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("incus: %s: read response: %w", req, err)
	}
	if len(data) > maxResponseBytes {
		return nil, nil, fmt.Errorf("incus: %s: response larger than %d bytes", req, maxResponseBytes)
	}
	r, err := decodeResponse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("incus: %s: %w", req, err)
	}
	if r.Type == typeError && r.ErrorCode == 0 {
		r.ErrorCode = resp.StatusCode
	}
	return r, resp.Header, nil
}

// get performs a synchronous GET and decodes its metadata into v, returning
// the ETag header.
func (c *Client) get(ctx context.Context, path string, v any) (string, error) {
	req := request{method: http.MethodGet, path: path}
	r, hdr, err := c.do(ctx, req)
	if err != nil {
		return "", err
	}
	if r.Type != typeSync {
		return "", fmt.Errorf("incus: %s: expected a sync response, got %q", req, r.Type)
	}
	if err := r.metadata(v); err != nil {
		return "", fmt.Errorf("incus: %s: %w", req, err)
	}
	return hdr.Get("ETag"), nil
}

// Server is the part of GET /1.0 the agent uses.
type Server struct {
	APIVersion    string            `json:"api_version"`
	APIExtensions []string          `json:"api_extensions"`
	APIStatus     string            `json:"api_status"`
	Auth          string            `json:"auth"`
	Config        map[string]string `json:"config"`
	Environment   ServerEnvironment `json:"environment"`
}

// ServerEnvironment describes the daemon's host.
type ServerEnvironment struct {
	Architectures   []string `json:"architectures"`
	Driver          string   `json:"driver"`
	DriverVersion   string   `json:"driver_version"`
	KernelVersion   string   `json:"kernel_version"`
	OSName          string   `json:"os_name"`
	OSVersion       string   `json:"os_version"`
	Server          string   `json:"server"`
	ServerName      string   `json:"server_name"`
	ServerPid       int      `json:"server_pid"`
	ServerVersion   string   `json:"server_version"`
	ServerClustered bool     `json:"server_clustered"`
	Storage         string   `json:"storage"`
}

// HasExtension reports whether the server announces the API extension.
func (s *Server) HasExtension(name string) bool {
	for _, e := range s.APIExtensions {
		if e == name {
			return true
		}
	}
	return false
}

// Server returns the daemon's description (GET /1.0).
func (c *Client) Server(ctx context.Context) (*Server, error) {
	var s Server
	if _, err := c.get(ctx, "/1.0", &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// escape escapes one path segment.
func escape(s string) string { return url.PathEscape(s) }

// WaitReady polls the daemon until it has finished starting (GET
// /internal/ready answers success), or the context ends.
func (c *Client) WaitReady(ctx context.Context) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, _, err := c.do(rctx, request{method: http.MethodGet, path: "/internal/ready"})
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("incus: wait for daemon at %s: %w (last error: %v)", c.socket, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// Query is the escape hatch for endpoints this package does not wrap (the
// test harness uses it for storage pools and profiles). It sends body as
// JSON (nil for none), waits for a background operation if one is started,
// and decodes the answer's metadata into result when result is not nil: the
// sync answer's metadata, or the finished operation when there was one.
func (c *Client) Query(ctx context.Context, method, path string, body, result any) error {
	if len(path) == 0 || path[0] != '/' {
		return fmt.Errorf("incus: query %s %q: path must start with /", method, path)
	}
	req := request{method: method, path: path, body: body}
	r, _, err := c.do(ctx, req)
	if err != nil {
		return err
	}
	if r.Type == typeAsync {
		id, err := operationID(r.Operation)
		if err != nil {
			return fmt.Errorf("incus: %s: %w", req, err)
		}
		op, err := c.waitOperation(ctx, id, req.String())
		if err != nil {
			return err
		}
		if result != nil {
			data, err := json.Marshal(op)
			if err != nil {
				return fmt.Errorf("incus: %s: %w", req, err)
			}
			return json.Unmarshal(data, result)
		}
		return nil
	}
	if result == nil {
		return nil
	}
	if err := r.metadata(result); err != nil {
		return fmt.Errorf("incus: %s: %w", req, err)
	}
	return nil
}
