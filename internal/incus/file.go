package incus

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
)

// maxPullBytes bounds PullFile; the agent pulls small files (versions,
// configuration), not data sets.
const maxPullBytes = 256 << 20

// FileInfo is the ownership, permission bits and type of a file inside an
// instance.
type FileInfo struct {
	UID  int64
	GID  int64
	Mode fs.FileMode // permission bits only
	Type string      // "file", "directory" or "symlink"
}

func filesRequest(method, instance, path string) request {
	return request{
		method: method,
		path:   instancePath(instance) + "/files",
		query:  url.Values{"path": {path}},
	}
}

// PushFile writes content to path inside the instance (creating or
// overwriting a regular file) with the owner and permission bits of info.
// The instance need not be running.
func (c *Client) PushFile(ctx context.Context, instance, path string, content io.Reader, info FileInfo) error {
	if content == nil {
		return fmt.Errorf("incus: push %s to %s: nil content", path, instance)
	}
	r := filesRequest(http.MethodPost, instance, path)
	r.body = content
	r.header = http.Header{
		"X-Incus-Uid":   {strconv.FormatInt(info.UID, 10)},
		"X-Incus-Gid":   {strconv.FormatInt(info.GID, 10)},
		"X-Incus-Mode":  {fmt.Sprintf("%04o", info.Mode.Perm())},
		"X-Incus-Type":  {"file"},
		"X-Incus-Write": {"overwrite"},
	}
	if _, _, err := c.do(ctx, r); err != nil {
		return fmt.Errorf("push %s to %s: %w", path, instance, err)
	}
	return nil
}

// PullFile reads a regular file from inside the instance, with its owner and
// permission bits. A missing file is a 404 *Error (see IsNotFound).
func (c *Client) PullFile(ctx context.Context, instance, path string) ([]byte, FileInfo, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opTimeout)
		defer cancel()
	}
	r := filesRequest(http.MethodGet, instance, path)
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("pull %s from %s: %w", path, instance, err)
	}
	defer resp.Body.Close()
	info, err := parseFileHeaders(resp.Header)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("incus: pull %s from %s: %w", path, instance, err)
	}
	if info.Type != "file" && info.Type != "symlink" {
		return nil, info, fmt.Errorf("incus: pull %s from %s: not a regular file (%s)", path, instance, info.Type)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPullBytes+1))
	if err != nil {
		return nil, info, fmt.Errorf("incus: pull %s from %s: %w", path, instance, err)
	}
	if len(data) > maxPullBytes {
		return nil, info, fmt.Errorf("incus: pull %s from %s: larger than %d bytes", path, instance, maxPullBytes)
	}
	return data, info, nil
}

func parseFileHeaders(h http.Header) (FileInfo, error) {
	var info FileInfo
	var err error
	if v := h.Get("X-Incus-Uid"); v != "" {
		if info.UID, err = strconv.ParseInt(v, 10, 64); err != nil {
			return info, fmt.Errorf("bad X-Incus-uid %q", v)
		}
	}
	if v := h.Get("X-Incus-Gid"); v != "" {
		if info.GID, err = strconv.ParseInt(v, 10, 64); err != nil {
			return info, fmt.Errorf("bad X-Incus-gid %q", v)
		}
	}
	if v := h.Get("X-Incus-Mode"); v != "" {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			return info, fmt.Errorf("bad X-Incus-mode %q", v)
		}
		info.Mode = fs.FileMode(m).Perm()
	}
	info.Type = h.Get("X-Incus-Type")
	if info.Type == "" {
		info.Type = "file"
	}
	return info, nil
}

// ListFiles returns the names of the entries of a directory inside the instance. A
// missing directory is a 404 *Error (see IsNotFound).
func (c *Client) ListFiles(ctx context.Context, instance, dir string) ([]string, error) {
	var names []string
	r := filesRequest(http.MethodGet, instance, dir)
	resp, hdr, err := c.do(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("list %s in %s: %w", dir, instance, err)
	}
	if t := hdr.Get("X-Incus-Type"); t != "" && t != "directory" {
		return nil, fmt.Errorf("incus: list %s in %s: not a directory (%s)", dir, instance, t)
	}
	if err := resp.metadata(&names); err != nil {
		return nil, fmt.Errorf("incus: list %s in %s: %w", dir, instance, err)
	}
	return names, nil
}
