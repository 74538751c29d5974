package container

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
)

// createMargin is what a new instance needs beyond its image's files: the files Incus
// writes for it (backup.yaml, templates) and a first start's logs, with room to spare,
// as the state directory's check (state.CheckRoom) keeps.
const createMargin = 16 << 20

// poolResources is the part of GET /1.0/storage-pools/{name}/resources the check reads:
// the pool's space as its driver sees it (for "dir", the filesystem under its source).
type poolResources struct {
	Space struct {
		Used  uint64 `json:"used"`
		Total uint64 `json:"total"`
	} `json:"space"`
}

// checkRoom fails, before a create, when the storage pool of the instance's root disk
// has less free space than the image unpacks to: Incus would otherwise fail halfway
// through the unpack ("no space left on device"), after the plan said it would create.
// What the image needs is at least its size as Incus stores it (compressed: it unpacks
// to more) plus createMargin, so the check only refuses what cannot fit.
func (k *Container) checkRoom(ctx context.Context, c *incus.Client, fingerprint string) error {
	pool, err := k.rootPool(ctx, c)
	if err != nil || pool == "" {
		return err // no root disk: Incus itself refuses the create, saying so
	}
	img, err := c.GetImage(ctx, fingerprint)
	if err != nil {
		return fmt.Errorf("image %s: %w", shortFP(fingerprint), resources.ReachErr(c, err))
	}
	path := "/1.0/storage-pools/" + url.PathEscape(pool) + "/resources"
	where := ""
	if k.target != "" {
		path += "?target=" + url.QueryEscape(k.target)
		where = " on member " + k.target
	}
	var res poolResources
	if err := c.Query(ctx, http.MethodGet, path, nil, &res); err != nil {
		return fmt.Errorf("storage pool %s%s: %w", pool, where, resources.ReachErr(c, err))
	}
	need := uint64(max(img.Size, 0)) + createMargin
	free := res.Space.Total - min(res.Space.Used, res.Space.Total)
	if free >= need {
		return nil
	}
	return fmt.Errorf("storage pool %s%s has %s free (%d bytes, of %s), and instance %s needs at least %s (%d bytes: image %s's %s, which it unpacks to more, and %s for the instance): free space in the pool (incus storage info %s; unused images: incus image list), grow it, or put the root disk on another pool (a disk device with path = \"/\" and pool = ...)",
		pool, where, bytesize.Format(free), free, bytesize.Format(res.Space.Total), k.name, bytesize.Format(need), need,
		shortFP(fingerprint), bytesize.Format(max(img.Size, 0)), bytesize.Format(createMargin), pool)
}

// rootPool is the storage pool the instance's root disk will be on: a disk device at
// path "/" among the plan's devices, else the last of its profiles that has one (Incus
// applies the profiles in order and the instance's own devices over them); "" when none
// has one.
func (k *Container) rootPool(ctx context.Context, c *incus.Client) (string, error) {
	for _, name := range containerKeys(k.devices) {
		if dev := k.devices[name]; dev["type"] == "disk" && dev["path"] == "/" {
			return dev["pool"], nil
		}
	}
	pool := ""
	for _, name := range k.profiles {
		var p struct {
			Devices map[string]map[string]string `json:"devices"`
		}
		if err := c.Query(ctx, http.MethodGet, "/1.0/profiles/"+url.PathEscape(name), nil, &p); err != nil {
			return "", fmt.Errorf("profile %s: %w", name, resources.ReachErr(c, err))
		}
		for _, dev := range p.Devices {
			if dev["type"] == "disk" && dev["path"] == "/" {
				pool = dev["pool"]
			}
		}
	}
	return pool, nil
}
