package resources

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
)

// userspaceInstallerArgs run NVIDIA's installer unattended, userspace only: the kernel
// module is the host's, and the libraries inside must match it exactly.
var userspaceInstallerArgs = []string{"--silent", "--no-questions", "--ui=none", "--no-kernel-module"}

// installUserspace downloads nvidia_installer through the verified download engine (into
// <state dir>/container/NAME/cache, sha256 checked), pushes it into the instance, runs it
// with --no-kernel-module, removes it, and checks that libnvidia-ml.so.1 inside is now the
// wanted version. A failure quotes the installer's own output.
func (k *Container) installUserspace(ctx context.Context, c *incus.Client, env *agent.Env) error {
	dir := state.DefaultDir
	if env != nil && env.State != nil {
		dir = env.State.Dir()
	}
	cache := filepath.Join(dir, "container", k.name, "cache")
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return err
	}
	name := installerName(k.installer.URL, k.userspace)
	res, err := fetch.Fetch(ctx, []fetch.File{{Name: name, URL: k.installer.URL, Size: -1, SHA256: k.installer.SHA256}}, fetch.Options{Dest: cache})
	if err != nil {
		return fmt.Errorf("nvidia_installer: download: %w", err)
	}
	f, err := os.Open(res.Files[0].Path)
	if err != nil {
		return err
	}
	defer f.Close()
	inside := "/root/" + name
	if err := c.PushFile(ctx, k.name, inside, f, incus.FileInfo{Mode: 0o700}); err != nil {
		return fmt.Errorf("nvidia_installer: push into %s: %w", k.name, err)
	}
	args := append([]string{"/bin/sh", inside}, userspaceInstallerArgs...)
	args = append(args, k.installer.Args...)
	if env != nil && env.Log != nil {
		env.Log.Info("installing the NVIDIA userspace driver inside the instance", "instance", k.name, "version", k.userspace)
	}
	out, err := c.Exec(ctx, k.name, incus.ExecRequest{Command: args})
	// The installer is 300 MB: never leave it inside, whatever happened.
	c.Exec(context.WithoutCancel(ctx), k.name, incus.ExecRequest{Command: []string{"rm", "-f", inside}})
	if err != nil {
		return fmt.Errorf("nvidia_installer inside %s: %w", k.name, err)
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("nvidia_installer inside %s: %s exited %d; last lines:\n%s", k.name, strings.Join(args[1:], " "), out.ExitCode,
			tailLines(append(out.Stdout, out.Stderr...), 15))
	}
	have, err := k.userspaceVersion(ctx, c)
	if err != nil {
		return err
	}
	if have != k.userspace {
		return fmt.Errorf("nvidia_installer inside %s finished, but libnvidia-ml.so.1 is %q, not %s: is the installer for this version?", k.name, have, k.userspace)
	}
	return nil
}
