package incustest

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// DebianAlias is the alias of the Debian image (DebianImage).
const DebianAlias = "debian-systemd"

// DebianSuite is the Debian release of the Debian image.
const DebianSuite = "bookworm"

// DebianPackages are installed into the Debian image on top of debootstrap's minbase
// variant: systemd as PID 1, and nothing else. minbase has no procps (no /bin/kill), as
// most container images: the agent's unit must not need it.
var DebianPackages = []string{"systemd", "systemd-sysv"}

// DebianInstallHint is the command that installs what DebianImage needs.
const DebianInstallHint = "sudo scripts/install-incus.sh (installs debootstrap)"

// CacheDir is where DebianImage keeps built root filesystems between runs
// ($AGENT_TEST_CACHE overrides it).
func CacheDir() string {
	if d := os.Getenv("AGENT_TEST_CACHE"); d != "" {
		return d
	}
	return "/var/cache/agent-test"
}

// debianBuildTimeout bounds a debootstrap run (a cold one downloads about 60 MB).
const debianBuildTimeout = 15 * time.Minute

// DebianImage returns the alias of a Debian bookworm image with systemd as /sbin/init,
// importing it into d on first use. Its root filesystem is built by debootstrap from the
// Debian mirror the host's apt already uses, once: the tarball is cached under CacheDir,
// keyed by suite, architecture and package list, with a checksum that is verified before
// each reuse. A build killed half way leaves only a temporary directory, removed by the
// next build; a tarball whose checksum does not match is rebuilt. Without debootstrap the
// test is skipped, or fails when CI=true.
func (d *Daemon) DebianImage(t testing.TB) string {
	t.Helper()
	d.debianOnce.Do(func() { d.debianSkip, d.debianErr = d.importDebian(t.Logf) })
	if d.debianSkip != "" {
		testbin.Missing(t, "incustest: "+d.debianSkip, "install with: "+DebianInstallHint)
	}
	if d.debianErr != nil {
		t.Fatalf("incustest: Debian image: %v", d.debianErr)
	}
	return DebianAlias
}

func (d *Daemon) importDebian(logf func(string, ...any)) (skip string, err error) {
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "debootstrap not found", nil
	}
	rootfs, err := debianRootfs(CacheDir(), logf)
	if err != nil {
		return "", err
	}
	f, err := os.Open(rootfs)
	if err != nil {
		return "", err
	}
	defer f.Close()
	meta, err := debianMetadata()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := d.Client.ImportImage(ctx, bytes.NewReader(meta), f, DebianAlias); err != nil {
		return "", fmt.Errorf("import %s: %w\n%s", rootfs, err, d.LogTail(20))
	}
	logf("incustest: imported %s in %s", rootfs, time.Since(start).Round(100*time.Millisecond))
	return "", nil
}

// debianKey names a root filesystem by what goes into it.
func debianKey() string {
	h := sha256.Sum256([]byte(strings.Join(append([]string{"v1", DebianSuite, "minbase", runtime.GOARCH}, DebianPackages...), "\n")))
	return hex.EncodeToString(h[:6])
}

// debianRootfs returns the path of the cached root filesystem tarball, building it when
// it is missing or fails its checksum. Builds are serialized by a lock in dir.
func debianRootfs(dir string, logf func(string, ...any)) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	name := fmt.Sprintf("debian-%s-%s-%s", DebianSuite, runtime.GOARCH, debianKey())
	tarball := filepath.Join(dir, name+".tar")
	sumFile := tarball + ".sha256"
	if err := verifySum(tarball, sumFile); err == nil {
		return tarball, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		logf("incustest: cached %s is not valid (%v); rebuilding", tarball, err)
	}
	// Leftovers of builds that were killed (we hold the lock: none is running).
	olds, _ := filepath.Glob(filepath.Join(dir, "build-*"))
	for _, o := range olds {
		_ = unmountUnder(o)
		_ = os.RemoveAll(o)
	}
	_ = os.Remove(tarball)
	_ = os.Remove(sumFile)

	build, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer func() {
		_ = unmountUnder(build)
		_ = os.RemoveAll(build)
	}()
	mirror, err := debianMirror()
	if err != nil {
		return "", err
	}
	target := filepath.Join(build, "rootfs")
	ctx, cancel := context.WithTimeout(context.Background(), debianBuildTimeout)
	defer cancel()
	start := time.Now()
	logf("incustest: building the Debian %s root filesystem from %s (once; cached in %s)", DebianSuite, mirror, dir)
	cmd := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--include="+strings.Join(DebianPackages, ","),
		DebianSuite, target, mirror)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("debootstrap: %w\n%s", err, tail(out, 30))
	}
	if err := prepareDebian(target); err != nil {
		return "", err
	}
	tmp := filepath.Join(build, "rootfs.tar")
	if out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "-C", target, "-cf", tmp, ".").CombinedOutput(); err != nil {
		return "", fmt.Errorf("tar the root filesystem: %w\n%s", err, tail(out, 10))
	}
	sum, err := fileSum(tmp)
	if err != nil {
		return "", err
	}
	// The tarball is renamed into place first and its checksum last: a run killed in
	// between leaves a tarball without a checksum, which is rebuilt.
	if err := syncFile(tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, tarball); err != nil {
		return "", err
	}
	if err := writeSync(sumFile, []byte(sum+"\n")); err != nil {
		return "", err
	}
	logf("incustest: built %s in %s", tarball, time.Since(start).Round(time.Second))
	return tarball, nil
}

// prepareDebian makes the root filesystem boot quickly and quietly in a container.
func prepareDebian(root string) error {
	for p, content := range map[string]string{
		"etc/hostname": "debian\n",
		"etc/hosts":    "127.0.0.1 localhost debian\n::1 localhost\n",
		// Each container gets its own machine ID at first boot.
		"etc/machine-id": "",
	} {
		if err := os.WriteFile(filepath.Join(root, p), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// No network in the test profile: units that wait for one only slow the boot.
	for _, unit := range []string{"systemd-networkd-wait-online.service", "apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"} {
		p := filepath.Join(root, "etc/systemd/system", unit)
		_ = os.Remove(p)
		if err := os.Symlink("/dev/null", p); err != nil {
			return err
		}
	}
	return nil
}

// debianMetadata is the metadata tarball of the split image.
func debianMetadata() ([]byte, error) {
	arch, ok := incusArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("no Incus architecture name for %s", runtime.GOARCH)
	}
	body := fmt.Sprintf("architecture: %s\ncreation_date: %d\nproperties:\n  os: debian\n  release: %s\n  description: Debian %s with systemd (test image)\ntemplates: {}\n",
		arch, time.Now().Unix(), DebianSuite, DebianSuite)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "metadata.yaml", Mode: 0o644, Size: int64(len(body)), ModTime: time.Now()}); err != nil {
		return nil, err
	}
	if _, err := io.WriteString(tw, body); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

var mirrorRE = regexp.MustCompile(`https?://[^\s]*`)

// debianMirror is $DEBIAN_MIRROR, else the first Debian archive URL of the host's apt
// sources (as scripts/install-incus.sh finds it).
func debianMirror() (string, error) {
	if m := os.Getenv("DEBIAN_MIRROR"); m != "" {
		return m, nil
	}
	files := []string{"/etc/apt/sources.list"}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if strings.HasPrefix(line, "#") {
				continue
			}
			for _, u := range mirrorRE.FindAllString(line, -1) {
				u = strings.TrimRight(u, "/")
				if strings.HasSuffix(u, "/debian") {
					return u, nil
				}
			}
		}
	}
	return "", errors.New("no Debian mirror in /etc/apt/sources.list*; set DEBIAN_MIRROR")
}

func verifySum(path, sumFile string) error {
	want, err := os.ReadFile(sumFile)
	if err != nil {
		return err
	}
	got, err := fileSum(path)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(want)) != got {
		return fmt.Errorf("checksum mismatch (%s recorded, %s now)", strings.TrimSpace(string(want)), got)
	}
	return nil
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}

func writeSync(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
