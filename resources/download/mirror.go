package download

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
)

// mirrorBase checks a `mirrors` entry: an http or https URL of the directory that holds
// the download's files under their relative paths, without query or credentials. Plain
// http is allowed to any host (a LAN peer has no certificate): every file a mirror sends
// is verified against the plan's sha256 or the Hub's before it is used.
func mirrorBase(m string) (string, error) {
	u, err := url.Parse(m)
	switch {
	case err != nil:
		return "", fmt.Errorf("mirror %q: %v", m, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("mirror %q: only http:// and https:// URLs (a static file server over a verified download, such as \"http://peer:8088/qwen\")", m)
	case u.Host == "":
		return "", fmt.Errorf("mirror %q has no host", m)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return "", fmt.Errorf("mirror %q: no credentials, query or fragment; a mirror is the URL of the directory holding the files", u.Redacted())
	}
	return strings.TrimRight(u.String(), "/"), nil
}

// withMirrors gives each file that has a hash to judge a copy by the URLs of its copy on
// each mirror: the base followed by the file's path relative to dest, each element escaped.
func withMirrors(files []fetch.File, mirrors []string) []fetch.File {
	if len(mirrors) == 0 {
		return files
	}
	files = slices.Clone(files)
	for i, f := range files {
		if f.SHA256 == "" && f.GitBlob == "" {
			continue
		}
		parts := strings.Split(f.Name, "/")
		for j, p := range parts {
			parts[j] = url.PathEscape(p)
		}
		rel := strings.Join(parts, "/")
		files[i].Mirrors = nil
		for _, m := range mirrors {
			files[i].Mirrors = append(files[i].Mirrors, m+"/"+rel)
		}
	}
	return files
}

// logSources says, when the download has mirrors, where each file came from: a mirror
// passed over is a warning (with its reason), and the bytes taken from the origin are
// counted, so a fleet that should pay the origin once can see that it does.
func logSources(env *agent.Env, mirrors []string, res fetch.Result) {
	if len(mirrors) == 0 || env == nil || env.Log == nil {
		return
	}
	var fromMirrors, fromOrigin, originBytes int64
	for _, fr := range res.Files {
		for _, e := range fr.MirrorErrors {
			env.Log.Warn("mirror passed over", "file", fr.Name, "error", e)
		}
		switch {
		case fr.From == "":
		case slices.ContainsFunc(mirrors, func(m string) bool { return strings.HasPrefix(fr.From, m+"/") }):
			fromMirrors++
		default:
			fromOrigin++
		}
		originBytes += fr.OriginBytes
	}
	if fromMirrors+fromOrigin > 0 {
		env.Log.Info("download sources", "files_from_mirrors", fromMirrors, "files_from_origin", fromOrigin, "origin_bytes", originBytes)
	}
}
