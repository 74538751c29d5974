package incustest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/testbin"
)

func TestBusyboxImage(t *testing.T) {
	bb, err := findBusybox()
	if err != nil {
		testbin.Missing(t, "no static busybox: "+err.Error(), "scripts/install-incus.sh installs busybox-static")
	}
	img, err := busyboxImage(bb)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(img))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	entries := map[string]*tar.Header{}
	contents := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries[h.Name] = h
		if h.Typeflag == tar.TypeReg && h.Size < 4096 {
			b, _ := io.ReadAll(tr)
			contents[h.Name] = string(b)
		}
	}
	if !strings.Contains(contents["metadata.yaml"], "architecture: ") || !strings.Contains(contents["metadata.yaml"], "creation_date: ") {
		t.Errorf("metadata.yaml: %q", contents["metadata.yaml"])
	}
	if h := entries["rootfs/bin/busybox"]; h == nil || h.Mode&0o111 == 0 {
		t.Errorf("rootfs/bin/busybox: %+v", h)
	}
	if h := entries["rootfs/bin/sh"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "busybox" {
		t.Errorf("rootfs/bin/sh: %+v", h)
	}
	if !strings.Contains(contents["rootfs/sbin/init"], "trap 'exit 0' PWR") {
		t.Errorf("init: %q", contents["rootfs/sbin/init"])
	}
	for _, d := range []string{"rootfs/proc/", "rootfs/sys/", "rootfs/dev/", "rootfs/tmp/", "rootfs/root/"} {
		if entries[d] == nil {
			t.Errorf("missing %s", d)
		}
	}
	again, err := busyboxImage(bb)
	if err != nil || !bytes.Equal(img, again) {
		t.Error("image is not reproducible (fingerprint would change between runs)")
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/incus-1/shmounts`: "/tmp/incus-1/shmounts",
		`/tmp/a\040b`:           "/tmp/a b",
		`/tmp/tab\011x\134`:     "/tmp/tab\tx\\",
		`/tmp/not\9octal\04`:    `/tmp/not\9octal\04`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// recorder is a testing.TB that records Skipf and Fatalf instead of ending
// the test.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Skipf(format string, args ...any)  { r.skipped = fmt.Sprintf(format, args...) }
func (r *recorder) Fatalf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func TestSkipOrFail(t *testing.T) {
	t.Setenv("CI", "")
	r := &recorder{TB: t}
	skipOrFail(r, "incusd not found")
	if r.failed != "" || !strings.Contains(r.skipped, "install-incus.sh") {
		t.Errorf("outside CI: skipped %q failed %q", r.skipped, r.failed)
	}
	t.Setenv("CI", "true")
	r = &recorder{TB: t}
	skipOrFail(r, "incusd not found")
	if r.skipped != "" || !strings.Contains(r.failed, "CI=true") {
		t.Errorf("in CI: skipped %q failed %q", r.skipped, r.failed)
	}
}

// TestStart runs a daemon of its own (next to any shared one) and checks that
// it serves, runs a container, and is gone after Close.
func TestStart(t *testing.T) {
	d := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := d.InstanceName(t)
	if err := d.Client.CreateInstance(ctx, incus.InstancesPost{Name: name, Source: incus.InstanceSource{Alias: d.Image}, Start: true}); err != nil {
		t.Fatalf("%v\n%s", err, d.LogTail(20))
	}
	res, err := d.Client.Exec(ctx, name, incus.ExecRequest{Command: []string{"cat", "/etc/hostname"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Close: %v", d.Dir, err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestDebianCacheValidation: a cached root filesystem is reused only with its checksum
// file, and only when the checksum matches (a tarball left by a killed build, or one
// damaged since, is rebuilt).
func TestDebianCacheValidation(t *testing.T) {
	dir := t.TempDir()
	tarball := dir + "/rootfs.tar"
	sum := tarball + ".sha256"
	if err := os.WriteFile(tarball, []byte("half a tarball"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := verifySum(tarball, sum); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("no checksum file: %v, want ErrNotExist (rebuild)", err)
	}
	good, err := fileSum(tarball)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeSync(sum, []byte(good+"\n")); err != nil {
		t.Fatal(err)
	}
	if err := verifySum(tarball, sum); err != nil {
		t.Errorf("matching checksum: %v", err)
	}
	if err := os.WriteFile(tarball, []byte("half a tarbalL"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := verifySum(tarball, sum); err == nil || !strings.Contains(err.Error(), "mismatch") {
		t.Errorf("damaged tarball: %v, want a mismatch", err)
	}
	if k := debianKey(); len(k) != 12 || k != debianKey() {
		t.Errorf("debianKey = %q", k)
	}
}

func TestDebianMirrorOverride(t *testing.T) {
	t.Setenv("DEBIAN_MIRROR", "http://mirror.invalid/debian")
	if m, err := debianMirror(); err != nil || m != "http://mirror.invalid/debian" {
		t.Errorf("debianMirror = %q, %v", m, err)
	}
}
