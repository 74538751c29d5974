package incustest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"
)

// initScript is the image's /sbin/init: it brings the loopback interface up (as
// any distribution's init does: a proxy device connects to 127.0.0.1 inside), then
// idles until Incus asks for a clean shutdown (SIGPWR, LXC's default halt signal)
// and exits, which stops the container. SIGTERM is honoured too.
const initScript = `#!/bin/sh
ip link set lo up 2>/dev/null
trap 'exit 0' PWR TERM
while :; do
	sleep 3600 &
	wait $!
done
`

// incusArch maps GOARCH to the architecture names Incus uses in images.
var incusArch = map[string]string{
	"amd64":   "x86_64",
	"arm64":   "aarch64",
	"386":     "i686",
	"ppc64le": "ppc64le",
	"s390x":   "s390x",
	"riscv64": "riscv64",
}

// checkStatic returns an error unless the file at p is a statically linked
// ELF executable (a dynamic busybox would not run in an empty rootfs).
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (install busybox-static)", p)
		}
	}
	return nil
}

// busyboxImage builds a unified image tarball (gzip) holding metadata.yaml
// and a rootfs with the static busybox, a symlink per applet, /sbin/init
// and minimal /etc files.
func busyboxImage(busybox string) ([]byte, error) {
	arch, ok := incusArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("no Incus architecture name for %s", runtime.GOARCH)
	}
	if err := checkStatic(busybox); err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	applets := strings.Fields(string(out))
	sort.Strings(applets)
	if len(applets) == 0 {
		return nil, fmt.Errorf("%s --list: no applets", busybox)
	}

	mtime := time.Unix(1700000000, 0)
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	var werr error
	add := func(h *tar.Header, body []byte) {
		if werr != nil {
			return
		}
		h.ModTime = mtime
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if werr = tw.WriteHeader(h); werr == nil && len(body) > 0 {
			_, werr = tw.Write(body)
		}
	}
	dir := func(name string, mode int64) {
		add(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: mode}, nil)
	}
	file := func(name string, mode int64, body string) {
		add(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: mode}, []byte(body))
	}

	file("metadata.yaml", 0o644, fmt.Sprintf(
		"architecture: %s\ncreation_date: %d\nproperties:\n  os: busybox\n  description: busybox test image\ntemplates: {}\n",
		arch, mtime.Unix()))
	dir("rootfs", 0o755)
	for _, d := range []string{"bin", "sbin", "etc", "dev", "proc", "sys", "run", "tmp", "var", "root", "home", "usr", "usr/bin", "usr/sbin"} {
		mode := int64(0o755)
		switch d {
		case "tmp":
			mode = 0o1777
		case "root":
			mode = 0o700
		}
		dir(path.Join("rootfs", d), mode)
	}
	add(&tar.Header{Name: "rootfs/bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bin)
	for _, a := range applets {
		if a == "busybox" || strings.ContainsAny(a, "/") {
			continue
		}
		add(&tar.Header{Name: "rootfs/bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	file("rootfs/sbin/init", 0o755, initScript)
	file("rootfs/etc/passwd", 0o644, "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")
	file("rootfs/etc/group", 0o644, "root:x:0:\nnogroup:x:65534:\n")
	file("rootfs/etc/hostname", 0o644, "busybox\n")
	if werr != nil {
		return nil, werr
	}
	if err := errors.Join(tw.Close(), gz.Close()); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
