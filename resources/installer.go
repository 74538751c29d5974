package resources

import (
	"net/url"
	"path"
	"strings"
	"time"
)

// The NVIDIA .run installer, as the nvidia_driver kind runs it on the host and the
// container kind inside an instance (nvidia_installer).

// DriverTimeout bounds one observe or apply of nvidia_driver: the installer downloads
// some 400 MB and builds a kernel module.
const DriverTimeout = 45 * time.Minute

func InstallerName(rawURL, version string) string {
	if u, err := url.Parse(rawURL); err == nil {
		if b := path.Base(u.Path); strings.HasSuffix(b, ".run") && !strings.HasPrefix(b, ".") {
			return b
		}
	}
	return "NVIDIA-Linux-" + version + ".run"
}

func TailLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
