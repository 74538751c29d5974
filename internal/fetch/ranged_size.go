package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// rangeClient is the client of a file's range workers: the caller's client with its
// transport wrapped for identity encoding and per-origin headers, and its redirects checked.
func (r *run) rangeClient(t *task) (*http.Client, *fileTransport) {
	c := *r.client
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	u, _ := url.Parse(t.f.URL) // validated before
	ft := &fileTransport{base: base, origin: origin(u), header: t.f.Header, r: r, t: t, last: newLastByte(), plain: true}
	c.Transport = ft
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return checkURL(req.URL, r.opts.Insecure || t.mirror)
	}
	return &c, ft
}

// acquire takes one of the Fetch's connection slots (Options.MaxConnections).
func (r *run) acquire(ctx context.Context) (func(), error) {
	select {
	case r.slots <- struct{}{}:
		return func() { <-r.slots }, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// probeResponse is an open answer to a ranged GET from byte 0, with the cancel of its
// request (which outlives the function that sent it).
type probeResponse struct {
	resp   *http.Response
	cancel context.CancelCauseFunc
}

func (p *probeResponse) close() {
	if p != nil {
		p.resp.Body.Close()
		p.cancel(nil)
	}
}

// learnSize finds the size of a file the plan gives none, as aria2c does: from a HEAD, or,
// when the server refuses HEAD or answers it without a length (both exist: object stores,
// proxies, chunked HEAD answers), from the Content-Range total of a first ranged GET, whose
// answer is returned open so that its bytes become the start of piece 0 rather than a
// request wasted. Either way every later answer is checked against the size learned here
// (fetchPiece): a changed total restarts the file, and the restart learns it again.
// errNoRanges means one stream: the server answered the GET with the whole file, or the
// file is empty.
func (r *run) learnSize(ctx context.Context, t *task, hc *http.Client) (int64, *probeResponse, error) {
	if size, ok := r.headSize(ctx, t, hc); ok {
		return size, nil, nil
	}
	budget := r.budget(t)
	for tries := 1; ; tries++ {
		size, first, err := r.probeSize(ctx, t, hc)
		if err == nil || ctx.Err() != nil || errors.Is(err, errNoRanges) || permanent(err) {
			return size, first, err
		}
		t.fr.Attempts++
		if err := budget.next(ctx, err, false, tries); err != nil {
			return 0, nil, err
		}
	}
}

// headSize asks HEAD for the file's length; ok is false when the answer gives none (any
// failure included: the ranged GET that follows says what is wrong, in its own words).
func (r *run) headSize(ctx context.Context, t *task, hc *http.Client) (int64, bool) {
	hctx, cancel := context.WithTimeout(ctx, r.opts.StallTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodHead, t.src, nil)
	if err != nil {
		return 0, false
	}
	req.Header.Set("User-Agent", "agent-fetch")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, false
	}
	resp.Body.Close()
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return 0, false // the length of another encoding
	}
	if resp.StatusCode != http.StatusOK || resp.ContentLength < 0 {
		return 0, false
	}
	return resp.ContentLength, true
}

// probeSize sends the first ranged GET (bytes 0 to one share of a piece) and reads the
// file's size from its Content-Range.
func (r *run) probeSize(ctx context.Context, t *task, hc *http.Client) (int64, *probeResponse, error) {
	want := int64(minSharePiece)
	if r.opts.PieceSize > 0 {
		want = min(want, r.opts.PieceSize)
	}
	pctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(pctx, http.MethodGet, t.src, nil)
	if err != nil {
		cancel(nil)
		return 0, nil, fmt.Errorf("request: %w", err)
	}
	req.Header.Set("User-Agent", "agent-fetch")
	req.Header.Set("Range", fmt.Sprintf("bytes=0-%d", want-1))
	stopWatch := r.watchStall(pctx, cancel, newLastByte())
	resp, err := hc.Do(req)
	stopWatch()
	if err != nil {
		cancel(nil)
		if errors.Is(context.Cause(pctx), ErrStalled) && ctx.Err() == nil {
			return 0, nil, fmt.Errorf("%w: no answer for %s", ErrStalled, r.opts.StallTimeout)
		}
		return 0, nil, err
	}
	fail := func(err error) (int64, *probeResponse, error) {
		resp.Body.Close()
		cancel(nil)
		return 0, nil, err
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
	case http.StatusOK:
		return fail(errNoRanges)
	case http.StatusRequestedRangeNotSatisfiable:
		// "bytes */0": an empty file has no byte 0.
		if v := resp.Header.Get("Content-Range"); v == "bytes */0" {
			return fail(errNoRanges)
		}
		return fail(statusErrorOf(resp, t.src))
	default:
		return fail(statusErrorOf(resp, t.src))
	}
	cs, _, total, err := parseContentRange(resp.Header.Get("Content-Range"))
	switch {
	case err != nil:
		return fail(fmt.Errorf("%w: %w", ErrBadResponse, err))
	case cs != 0:
		return fail(fmt.Errorf("%w: asked for bytes from 0, got Content-Range %q", ErrBadResponse, resp.Header.Get("Content-Range")))
	case total < 0:
		return fail(errNoRanges) // "bytes 0-N/*": the size stays unknown, one stream
	}
	return total, &probeResponse{resp: resp, cancel: cancel}, nil
}
