package export

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
)

// Container is an Incus instance.
type Container struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Image is an alias of the instance's base image when one exists, else its
	// fingerprint; ImageNote says what was guessed.
	Image       string                       `json:"image"`
	Fingerprint string                       `json:"fingerprint,omitempty"`
	ImageNote   string                       `json:"image_note,omitempty"`
	Profiles    []string                     `json:"profiles"`
	Config      map[string]string            `json:"config"`  // own keys, server-owned ones left out
	Devices     map[string]map[string]string `json:"devices"` // own devices
	Description string                       `json:"description,omitempty"`
	Running     bool                         `json:"running"`
}

// serverOwned is the container resource's rule: Incus sets these keys itself.
func serverOwned(key string) bool {
	return strings.HasPrefix(key, "volatile.") || strings.HasPrefix(key, "image.")
}

func observeInstances(ctx context.Context, c *incus.Client) ([]Container, []string, error) {
	var insts []incus.Instance
	if err := c.Query(ctx, "GET", "/1.0/instances?recursion=1", nil, &insts); err != nil {
		return nil, nil, fmt.Errorf("incus (%s): list instances: %w", c.Socket(), err)
	}
	var out []Container
	var notes []string
	for _, in := range insts {
		k := Container{Name: in.Name, Type: in.Type, Profiles: in.Profiles, Description: in.Description,
			Config: map[string]string{}, Devices: map[string]map[string]string{}, Running: in.Running()}
		if k.Profiles == nil {
			k.Profiles = []string{}
		}
		for key, v := range in.Config {
			if !serverOwned(key) {
				k.Config[key] = v
			}
		}
		for name, dev := range in.Devices {
			d := maps.Clone(dev)
			if d["type"] == "gpu" && d["pci"] != "" {
				d["pci"] = gpu.NormalizePCIBusID(d["pci"])
			}
			k.Devices[name] = d
		}
		fp := in.Config["volatile.base_image"]
		k.Fingerprint = fp
		switch {
		case fp == "":
			k.Image = "TODO"
			k.ImageNote = "the instance records no base image (volatile.base_image): name the image it should be created from"
		default:
			img, err := c.GetImage(ctx, fp)
			switch {
			case err != nil:
				k.Image = fp
				k.ImageNote = fmt.Sprintf("base image %s is no longer in the image store (%v): copy or rebuild it on the new host", fp[:min(12, len(fp))], err)
			case len(img.Aliases) > 0:
				names := make([]string, len(img.Aliases))
				for i, a := range img.Aliases {
					names[i] = a.Name
				}
				sort.Strings(names)
				k.Image = names[0]
				k.ImageNote = fmt.Sprintf("alias of fingerprint %s; the new host needs an image under this alias", fp[:min(12, len(fp))])
			default:
				k.Image = fp
				k.ImageNote = "the base image has no alias: the new host needs this exact image (incus image export / import)"
			}
			if desc := in.Config["image.description"]; desc != "" && k.ImageNote != "" {
				k.ImageNote += " (" + desc + ")"
			}
		}
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, notes, nil
}
