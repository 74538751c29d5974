package incus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"time"
)

// Image is a local image as GET /1.0/images/{fingerprint} returns it.
type Image struct {
	Fingerprint  string            `json:"fingerprint"`
	Architecture string            `json:"architecture"`
	Type         string            `json:"type"` // container or virtual-machine
	Filename     string            `json:"filename"`
	Size         int64             `json:"size"`
	Public       bool              `json:"public"`
	Properties   map[string]string `json:"properties"`
	Aliases      []ImageAlias      `json:"aliases"`
	CreatedAt    time.Time         `json:"created_at"`
	UploadedAt   time.Time         `json:"uploaded_at"`
}

// ImageAlias is a name for an image. Target is the image's fingerprint.
type ImageAlias struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Target      string `json:"target,omitempty"`
	Type        string `json:"type,omitempty"`
}

// GetImage returns the image with the given (full) fingerprint.
func (c *Client) GetImage(ctx context.Context, fingerprint string) (*Image, error) {
	var img Image
	if _, err := c.get(ctx, "/1.0/images/"+escape(fingerprint), &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// GetImageAlias returns the alias; its Target is the image fingerprint.
func (c *Client) GetImageAlias(ctx context.Context, name string) (*ImageAlias, error) {
	var a ImageAlias
	if _, err := c.get(ctx, "/1.0/images/aliases/"+escape(name), &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// ImportImage uploads an image and returns its fingerprint. With rootfs nil,
// meta is a unified tarball (metadata.yaml, templates/ and rootfs/ in one
// archive); otherwise meta is the metadata tarball and rootfs the root
// filesystem tarball (or squashfs) of a split image. Each alias is created
// pointing at the new image.
func (c *Client) ImportImage(ctx context.Context, meta, rootfs io.Reader, aliases ...string) (string, error) {
	if meta == nil {
		return "", errors.New("incus: import image: nil metadata")
	}
	r := request{method: http.MethodPost, path: "/1.0/images", header: http.Header{}}
	if rootfs == nil {
		r.body = meta
	} else {
		pr, pw := io.Pipe()
		mw := multipart.NewWriter(pw)
		go func() {
			pw.CloseWithError(writeSplitImage(mw, meta, rootfs))
		}()
		defer pr.Close() // unblocks the writer if the request ends early
		r.body = pr
		r.header.Set("Content-Type", mw.FormDataContentType())
	}
	if len(aliases) > 0 {
		v := url.Values{"alias": aliases}
		r.header.Set("X-Incus-Aliases", v.Encode())
	}
	op, err := c.run(ctx, r)
	if err != nil {
		return "", fmt.Errorf("import image: %w", err)
	}
	if op == nil {
		return "", errors.New("incus: import image: no operation")
	}
	fp, _ := op.Metadata["fingerprint"].(string)
	if fp == "" {
		return "", fmt.Errorf("incus: import image: operation %s has no fingerprint", op.ID)
	}
	return fp, nil
}

func writeSplitImage(mw *multipart.Writer, meta, rootfs io.Reader) error {
	for _, part := range []struct {
		name string
		r    io.Reader
	}{{"metadata", meta}, {"rootfs", rootfs}} {
		w, err := mw.CreateFormFile(part.name, part.name)
		if err != nil {
			return err
		}
		if _, err := io.Copy(w, part.r); err != nil {
			return fmt.Errorf("copy %s: %w", part.name, err)
		}
	}
	return mw.Close()
}
