package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources"
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
	name := resources.InstallerName(k.installer.URL, k.userspace)
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
			resources.TailLines(append(out.Stdout, out.Stderr...), 15))
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

// userspaceScript prints the NVIDIA userspace driver version inside the instance: the
// target of libnvidia-ml.so.1 (libnvidia-ml.so.580.95.05), or what nvidia-smi says. It
// prints nothing when there is no driver.
const userspaceScript = `for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu /lib64 /usr/local/nvidia/lib64; do
  if [ -e "$d/libnvidia-ml.so.1" ] || [ -L "$d/libnvidia-ml.so.1" ]; then
    t=$(readlink -f "$d/libnvidia-ml.so.1" 2>/dev/null || readlink "$d/libnvidia-ml.so.1")
    echo "lib ${t##*/}"
    exit 0
  fi
done
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "smi $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
fi
exit 0
`

// userspaceVersion reads the NVIDIA userspace driver version inside the running
// instance; "" when it has none.
func (k *Container) userspaceVersion(ctx context.Context, c *incus.Client) (string, error) {
	res, err := c.Exec(ctx, k.name, incus.ExecRequest{Command: []string{"/bin/sh", "-c", userspaceScript}})
	if err != nil {
		return "", fmt.Errorf("read the NVIDIA userspace driver version inside %s: %w", k.name, err)
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("read the NVIDIA userspace driver version inside %s: exit code %d: %s", k.name, res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return parseUserspace(string(res.Stdout)), nil
}

// parseUserspace reads the script's answer: "lib libnvidia-ml.so.580.95.05" or
// "smi 580.95.05".
func parseUserspace(out string) string {
	out = strings.TrimSpace(out)
	switch {
	case strings.HasPrefix(out, "lib "):
		v := strings.TrimPrefix(out, "lib ")
		if rest, ok := strings.CutPrefix(v, "libnvidia-ml.so."); ok && isDriverVersion(rest) {
			return rest
		}
		return ""
	case strings.HasPrefix(out, "smi "):
		v := strings.TrimSpace(strings.TrimPrefix(out, "smi "))
		if isDriverVersion(v) {
			return v
		}
	}
	return ""
}

func (k *Container) userspaceFix(have string) string {
	what := fmt.Sprintf("the NVIDIA userspace driver inside %s is %s", k.name, have)
	if have == "" {
		what = fmt.Sprintf("instance %s has no NVIDIA userspace driver (no libnvidia-ml.so.1)", k.name)
	}
	return fmt.Sprintf("%s, and the plan wants %s to match the host's kernel module (a mismatch fails with \"Driver/library version mismatch\"). Add an nvidia_installer { url, sha256 } block (the agent then runs it inside with --no-kernel-module), run NVIDIA-Linux-x86_64-%s.run --no-kernel-module --silent inside yourself, or set nvidia_runtime = true to mount the host's libraries",
		what, k.userspace, k.userspace)
}

// verifyUserspace checks the userspace driver once a new instance runs, and installs it
// when an installer is declared.
func (k *Container) verifyUserspace(ctx context.Context, c *incus.Client, env *agent.Env) error {
	if k.userspace == "" || !k.running {
		return nil
	}
	have, err := k.userspaceVersion(ctx, c)
	if err != nil {
		return err
	}
	if have == k.userspace {
		return nil
	}
	if k.installer != nil {
		return k.installUserspace(ctx, c, env)
	}
	return errors.New(k.userspaceFix(have))
}
