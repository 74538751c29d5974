package fetch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cavaliergopher/grab/v3"
)

// StatusError is an HTTP answer that is not the file: its status and what the server said
// about it (a Hub sends X-Error-Code and X-Error-Message: "GatedRepo", "Access to model … is
// restricted and you are not in the authorized list. Visit … to ask for access.").
type StatusError struct {
	Status int
	// URL is the address that answered, without its query (a signed CDN URL's query is a
	// credential).
	URL string
	// Code and Message are the X-Error-Code and X-Error-Message headers, if any.
	Code, Message string
	// RetryAfter is the server's Retry-After (429, 503), 0 if none.
	RetryAfter time.Duration
	// Redirected: the answer came from where a redirect led (a CDN), not from the file's
	// own URL. A signed URL there may simply have expired: the next attempt re-resolves
	// through the file's URL, so such an answer is retried rather than final.
	Redirected bool
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("%s answered %d %s", e.URL, e.Status, http.StatusText(e.Status))
	switch {
	case e.Code != "" && e.Message != "":
		s += fmt.Sprintf(" (%s: %s)", e.Code, e.Message)
	case e.Message != "":
		s += fmt.Sprintf(" (%s)", e.Message)
	case e.Code != "":
		s += fmt.Sprintf(" (%s)", e.Code)
	}
	return s
}

// maxRetryAfter bounds how long a server's Retry-After is obeyed at once.
const maxRetryAfter = 10 * time.Minute

// statusErrorOf describes a response that is not the file.
func statusErrorOf(resp *http.Response, fileURL string) *StatusError {
	e := &StatusError{Status: resp.StatusCode, URL: fileURL}
	if resp.Request != nil && resp.Request.URL != nil {
		u := *resp.Request.URL
		e.Redirected = u.String() != fileURL
		u.RawQuery, u.Fragment, u.User = "", "", nil
		e.URL = u.String()
	} else if u, err := url.Parse(fileURL); err == nil {
		u.RawQuery = ""
		e.URL = u.String()
	}
	e.Code = oneLine(resp.Header.Get("X-Error-Code"))
	e.Message = oneLine(resp.Header.Get("X-Error-Message"))
	e.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	return e
}

// oneLine keeps a server's words printable: no control characters, at most 500 bytes.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, strings.TrimSpace(s))
	if len(s) > 500 {
		s = s[:500] + "…"
	}
	return s
}

// parseRetryAfter reads Retry-After as seconds or an HTTP date (RFC 9110 10.2.3); 0 when
// absent or unreadable, at most maxRetryAfter.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	var d time.Duration
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		d = time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, 0), maxRetryAfter)
}

// permanent reports errors that another attempt would only repeat: a refused redirect, or a
// 4xx status other than 408 and 429 from the file's own URL. A 4xx from where a redirect led
// (a CDN whose signed URL expired) is not: the next attempt asks the file's URL again.
func permanent(err error) bool {
	var se *StatusError
	if errors.As(err, &se) {
		return se.Status >= 400 && se.Status < 500 && se.Status != http.StatusRequestTimeout &&
			se.Status != http.StatusTooManyRequests && !se.Redirected
	}
	var sc grab.StatusCodeError
	if errors.As(err, &sc) {
		return sc >= 400 && sc < 500 && sc != http.StatusRequestTimeout && sc != http.StatusTooManyRequests
	}
	return errors.Is(err, ErrInsecureURL)
}

// retryWait is the wait before retry number n (1-based) after err: the server's
// Retry-After when it gave one, otherwise an exponential backoff with jitter (half fixed,
// half random) so that many connections refused at once do not come back at once.
func (r *run) retryWait(n int, err error) time.Duration {
	var se *StatusError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter
	}
	d := r.opts.RetryBackoff
	for i := 1; i < n && d < maxRetryBackoff; i++ {
		d *= 2
	}
	d = min(d, maxRetryBackoff)
	return d/2 + rand.N(d/2+1)
}

// retryBudget counts failed attempts in a row. Bytes arriving reset it: a slow link whose
// signed URLs expire every few minutes makes progress on every attempt and must finish, while
// a server that sends nothing runs out of attempts.
type retryBudget struct {
	r        *run
	failures int
	// mirror: a failure without a byte since the last one gives the mirror up at once
	// (down, missing the file, busy): the next source is tried without a wait.
	mirror bool
}

// budget is a fresh retry budget for t's current source.
func (r *run) budget(t *task) *retryBudget { return &retryBudget{r: r, mirror: t.mirror} }

// next decides after a failed attempt: nil to try again (after waiting), or the final error.
func (b *retryBudget) next(ctx context.Context, err error, progressed bool, attempts int) error {
	// A file that arrived whole but wrong made no progress, however many bytes it took.
	progress := progressed && !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrSize)
	if progress {
		b.failures = 0
	}
	limit := b.r.opts.Retries
	if b.mirror && !progress {
		limit = 0
	}
	if b.failures >= limit {
		if b.failures > 0 {
			return fmt.Errorf("giving up after %d attempts, the last %d without a byte: %w", attempts, b.failures+1, err)
		}
		return err
	}
	b.failures++
	return sleep(ctx, b.r.retryWait(b.failures, err))
}
