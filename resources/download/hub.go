package download

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/fetch"
)

// The Hugging Face Hub source: a repository's files listed through the Hub API, pinned to one
// commit, downloaded from {endpoint}/{repo}/resolve/{commit}/{path}.

// hubFile is one file of a repository at a commit, as the tree API lists it.
type hubFile struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	// SHA256 is the LFS object id (the sha256 of the content); empty for files kept in git.
	SHA256 string `json:"sha256,omitempty"`
	// BlobOID is the git blob id (sha1 of "blob SIZE\x00" + content).
	BlobOID string `json:"blob_oid,omitempty"`
}

// hubListing is a repository's files at a commit: the cache kept in state, so that a plan of
// a converged download pinned to a commit needs no network at all.
type hubListing struct {
	Endpoint string    `json:"endpoint"`
	Repo     string    `json:"repo"`
	Revision string    `json:"revision"`
	Commit   string    `json:"commit"`
	ListedAt time.Time `json:"listed_at"`
	Files    []hubFile `json:"files"`
}

func (l *hubListing) matches(endpoint, repo, revision string) bool {
	return l != nil && l.Endpoint == endpoint && l.Repo == repo && (l.Revision == revision || l.Commit == revision)
}

var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// isCommit reports whether a revision is a full commit hash (a pin) rather than a branch or
// tag name.
func isCommit(rev string) bool { return commitRE.MatchString(rev) }

// hubClient talks to the Hub API. The token goes only to the endpoint's own scheme and
// host:port, never to a host a redirect leads to, and never into an error or a log line.
type hubClient struct {
	endpoint *url.URL
	token    string
	insecure bool
	client   *http.Client
}

const (
	hubRequestTimeout = 60 * time.Second
	hubMaxPages       = 10000
)

func newHubClient(endpoint, token string, insecure bool) (*hubClient, error) {
	u, err := url.Parse(strings.TrimRight(endpoint, "/"))
	if err != nil {
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	if err := allowedURL(u, insecure); err != nil {
		return nil, fmt.Errorf("endpoint: %w", err)
	}
	h := &hubClient{endpoint: u, token: token, insecure: insecure}
	h.client = &http.Client{
		Timeout:   hubRequestTimeout,
		Transport: &tokenTransport{base: http.DefaultTransport, origin: originOf(u), token: token},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 10 {
				return errors.New("stopped after 10 redirects")
			}
			return allowedURL(req.URL, insecure)
		},
	}
	return h, nil
}

// tokenTransport adds the bearer token to requests for one origin only.
type tokenTransport struct {
	base   http.RoundTripper
	origin string
	token  string
}

func (t *tokenTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	out.Header.Del("Authorization")
	if t.token != "" && originOf(out.URL) == t.origin {
		out.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(out)
}

// allowedURL allows https, and http to loopback hosts or when insecure.
func allowedURL(u *url.URL, insecure bool) error {
	switch strings.ToLower(u.Scheme) {
	case "https":
		if u.Host == "" {
			return fmt.Errorf("%q has no host", u.Redacted())
		}
		return nil
	case "http":
		if insecure || isLoopbackHost(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("%q uses plain http to a non-loopback host (set insecure = true to allow it)", u.Redacted())
	}
	return fmt.Errorf("%q: only https (or http to a loopback host) is allowed", u.Redacted())
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func originOf(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	return scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// repoPath is the repository id as it appears in URLs ("Qwen/Qwen3.6-27B").
func repoPath(repo string) string {
	parts := strings.Split(repo, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

func (h *hubClient) url(format string, args ...any) string {
	return h.endpoint.String() + fmt.Sprintf(format, args...)
}

// fileURL is where a file of the repository at a commit is downloaded from.
func (h *hubClient) fileURL(repo, commit, name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return h.url("/%s/resolve/%s/%s", repoPath(repo), commit, strings.Join(parts, "/"))
}

// hubError is an unexpected answer of the Hub: the status, the Hub's own words
// (X-Error-Code and X-Error-Message, as huggingface_hub's hf_raise_for_status reads them:
// "GatedRepo" / "Access to model org/m is restricted and you are not in the authorized list.
// Visit https://huggingface.co/org/m to ask for access."), the repository's page, and a hint
// that fits whether a token was sent.
type hubError struct {
	what          string
	status        int
	code, message string
	repoURL       string
	tokenSent     bool
}

func (h *hubClient) errorOf(what, repo string, resp *http.Response) *hubError {
	return &hubError{what: what, status: resp.StatusCode,
		code: hubWords(resp.Header.Get("X-Error-Code")), message: hubWords(resp.Header.Get("X-Error-Message")),
		repoURL: h.url("/%s", repoPath(repo)), tokenSent: h.token != ""}
}

func (e *hubError) Error() string {
	s := fmt.Sprintf("%s: status %d %s", e.what, e.status, http.StatusText(e.status))
	return s + hubSays(e.code, e.message) + hubHint(e.status, e.code, e.repoURL, e.tokenSent)
}

// hubWords keeps a header's text printable and short.
func hubWords(s string) string {
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

// hubSays quotes the Hub's X-Error-Code and X-Error-Message.
func hubSays(code, message string) string {
	switch {
	case code != "" && message != "":
		return fmt.Sprintf("; the Hub says %s: %s", code, message)
	case message != "":
		return "; the Hub says: " + message
	case code != "":
		return "; the Hub says " + code
	}
	return ""
}

// hubHint says what to do about a refused request, naming the repository's page. "Needs a
// token" only when none was sent: with a token, a 401 means the token was not accepted and a
// 403 (GatedRepo) that its account has not been granted access, which no new token fixes.
func hubHint(status int, code, repoURL string, tokenSent bool) string {
	switch {
	case (status == http.StatusUnauthorized || status == http.StatusForbidden) && !tokenSent:
		return fmt.Sprintf(" (%s: a gated or private repository needs a token: token_file or HF_TOKEN)", repoURL)
	case status == http.StatusUnauthorized:
		return fmt.Sprintf(" (%s: the token was not accepted, or its account cannot read this repository)", repoURL)
	case code == "GatedRepo":
		return fmt.Sprintf(" (%s: the token's account is not granted access to this gated repository; ask for it on that page)", repoURL)
	case status == http.StatusForbidden:
		return fmt.Sprintf(" (%s: the token lacks permission for this repository)", repoURL)
	case status == http.StatusNotFound:
		return fmt.Sprintf(" (%s: check repo and revision)", repoURL)
	}
	return " (" + repoURL + ")"
}

// hubFetchError adds the repository's page and the hint to a file the Hub refused (the
// server's words are in the fetch.StatusError already); an answer from the CDN a redirect
// led to is left as it is.
func hubFetchError(err error, src *hubSource, tokenSent bool) error {
	var se *fetch.StatusError
	if !errors.As(err, &se) || se.Redirected || se.Status < 400 || se.Status >= 500 {
		return err
	}
	h := &hubClient{endpoint: mustURL(src.endpoint)}
	return fmt.Errorf("%w%s", err, hubHint(se.Status, se.Code, h.url("/%s", repoPath(src.repo)), tokenSent))
}

func (h *hubClient) get(ctx context.Context, method, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "agent-download")
	return h.client.Do(req)
}

// resolve returns the commit a revision names: the revision itself when it is a commit hash
// (no request), otherwise the sha of GET /api/models/{repo}/revision/{revision}; a mirror
// without that API is asked with a HEAD of a file's resolve URL, whose X-Repo-Commit names it.
func (h *hubClient) resolve(ctx context.Context, repo, revision string) (string, error) {
	if isCommit(revision) {
		return revision, nil
	}
	what := fmt.Sprintf("resolve revision %q of %s", revision, repo)
	resp, err := h.get(ctx, http.MethodGet, h.url("/api/models/%s/revision/%s", repoPath(repo), url.PathEscape(revision)))
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		var info struct {
			SHA string `json:"sha"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&info); err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		if !isCommit(info.SHA) {
			return "", fmt.Errorf("%s: the Hub answered sha %q, not a commit hash", what, info.SHA)
		}
		return info.SHA, nil
	}
	if c := resp.Header.Get("X-Repo-Commit"); isCommit(c) {
		return c, nil
	}
	if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusMethodNotAllowed {
		return "", h.errorOf(what, repo, resp)
	}
	// No revision API (a mirror): a HEAD of a resolve URL names the commit.
	for _, probe := range []string{".gitattributes", "config.json", "README.md"} {
		hr, err := h.headNoRedirect(ctx, h.url("/%s/resolve/%s/%s", repoPath(repo), url.PathEscape(revision), probe))
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		hr.Body.Close()
		if c := hr.Header.Get("X-Repo-Commit"); isCommit(c) {
			return c, nil
		}
	}
	return "", h.errorOf(what, repo, resp)
}

// headNoRedirect sends HEAD without following a redirect: the Hub's answer itself carries
// X-Repo-Commit, the CDN's does not.
func (h *hubClient) headNoRedirect(ctx context.Context, u string) (*http.Response, error) {
	c := *h.client
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, u, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// treeEntry is one entry of GET /api/models/{repo}/tree/{revision}.
type treeEntry struct {
	Type string `json:"type"` // "file" or "directory"
	Path string `json:"path"`
	Size int64  `json:"size"`
	OID  string `json:"oid"` // git blob id
	LFS  *struct {
		OID  string `json:"oid"` // sha256 of the content
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// list returns every file of the repository at commit, following the Link rel="next" pages.
func (h *hubClient) list(ctx context.Context, repo, commit string) ([]hubFile, error) {
	what := fmt.Sprintf("list files of %s at %s", repo, commit)
	next := h.url("/api/models/%s/tree/%s?recursive=true", repoPath(repo), commit)
	var out []hubFile
	seen := map[string]bool{}
	for page := 0; next != ""; page++ {
		if page >= hubMaxPages {
			return nil, fmt.Errorf("%s: more than %d pages", what, hubMaxPages)
		}
		resp, err := h.get(ctx, http.MethodGet, next)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		var entries []treeEntry
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, h.errorOf(what, repo, resp)
		}
		err = json.NewDecoder(io.LimitReader(resp.Body, 256<<20)).Decode(&entries)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: page %d: %w", what, page+1, err)
		}
		for _, e := range entries {
			if e.Type != "file" {
				continue
			}
			if err := hubSafePath(e.Path); err != nil {
				return nil, fmt.Errorf("%s: the Hub lists %w; refusing the listing", what, err)
			}
			if seen[e.Path] {
				continue
			}
			seen[e.Path] = true
			f := hubFile{Path: e.Path, Size: e.Size, BlobOID: e.OID}
			if e.LFS != nil {
				sum := strings.ToLower(e.LFS.OID)
				if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
					return nil, fmt.Errorf("%s: %q: LFS oid %q is not a sha256", what, e.Path, e.LFS.OID)
				}
				f.SHA256, f.Size = sum, e.LFS.Size
			}
			if f.Size < 0 {
				return nil, fmt.Errorf("%s: %q: negative size %d", what, e.Path, f.Size)
			}
			out = append(out, f)
		}
		next, err = nextLink(resp.Request.URL, resp.Header.Values("Link"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
	return out, nil
}

// hubSafePath refuses paths that are not a clean relative path (fetch refuses them as well,
// and also symlinks out of the destination; this says where the name came from).
func hubSafePath(p string) error {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, `\`) || strings.ContainsRune(p, 0) || path.Clean(p) != p {
		return fmt.Errorf("an unsafe path %q", p)
	}
	for _, elem := range strings.Split(p, "/") {
		if elem == ".." || elem == "." {
			return fmt.Errorf("an unsafe path %q", p)
		}
	}
	return nil
}

// nextLink finds rel="next" in Link headers, resolved against the page's URL.
func nextLink(base *url.URL, links []string) (string, error) {
	for _, header := range links {
		for _, link := range strings.Split(header, ",") {
			parts := strings.Split(link, ";")
			target := strings.TrimSpace(parts[0])
			if !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			for _, param := range parts[1:] {
				k, v, _ := strings.Cut(strings.TrimSpace(param), "=")
				if strings.EqualFold(k, "rel") && strings.EqualFold(strings.Trim(v, `"`), "next") {
					u, err := base.Parse(target[1 : len(target)-1])
					if err != nil {
						return "", fmt.Errorf("bad Link header: %w", err)
					}
					return u.String(), nil
				}
			}
		}
	}
	return "", nil
}

// globSet matches repository paths as huggingface_hub's allow/ignore patterns do (fnmatch):
// `*` matches any run of characters, slashes included, `?` one character, `[…]` a class; a
// pattern ending in "/" matches everything under that directory.
type globSet []*regexp.Regexp

func compileGlobs(patterns []string) (globSet, error) {
	var out globSet
	for _, p := range patterns {
		if strings.HasSuffix(p, "/") {
			p += "*"
		}
		var b strings.Builder
		b.WriteString("^")
		for i := 0; i < len(p); i++ {
			switch c := p[i]; c {
			case '*':
				b.WriteString(".*")
			case '?':
				b.WriteString(".")
			case '[':
				j := strings.IndexByte(p[i+1:], ']')
				if j < 0 {
					return nil, fmt.Errorf("pattern %q: unclosed [", p)
				}
				class := p[i+1 : i+1+j]
				if strings.HasPrefix(class, "!") {
					class = "^" + class[1:]
				}
				b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
				i += j + 1
			default:
				b.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		b.WriteString("$")
		re, err := regexp.Compile(b.String())
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", p, err)
		}
		out = append(out, re)
	}
	return out, nil
}

func (g globSet) match(p string) bool {
	for _, re := range g {
		if re.MatchString(p) {
			return true
		}
	}
	return false
}
