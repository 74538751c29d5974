package incustest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/testbin"
)

// ImageAlias is the alias of the busybox image every daemon has.
const ImageAlias = "busybox"

// InstallHint is the command that installs what the harness needs.
const InstallHint = "sudo scripts/install-incus.sh (Debian bookworm: apt-get install -t bookworm-backports incus-base busybox-static)"

const (
	startTimeout    = 90 * time.Second
	shutdownTimeout = 60 * time.Second
)

// Daemon is a running private incusd.
type Daemon struct {
	Dir              string        // INCUS_DIR, removed at teardown
	Socket           string        // the daemon's unix socket
	Client           *incus.Client // a client for it
	Image            string        // the busybox image alias (ImageAlias)
	ImageFingerprint string        // the busybox image fingerprint

	mu     sync.Mutex    // guards cmd
	cmd    *exec.Cmd     // nil once closed
	exited chan struct{} // closed when the daemon process has exited
	logf   *os.File

	debianOnce sync.Once // imports the Debian image (DebianImage)
	debianSkip string
	debianErr  error
}

func (d *Daemon) closed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cmd == nil
}

// Start starts a daemon for this test alone and tears it down when the test
// ends. Prefer a Shared daemon per test binary: startup takes seconds.
func Start(t testing.TB) *Daemon {
	t.Helper()
	d, skip, err := start()
	if skip != "" {
		skipOrFail(t, skip)
	}
	if err != nil {
		t.Fatalf("incustest: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("incustest: %v", err)
		}
	})
	return d
}

// Shared is one daemon shared by the tests of a test binary, started by the
// first test that needs it and stopped by Run after all tests.
type Shared struct {
	once sync.Once
	d    *Daemon
	skip string
	err  error
}

// NewShared returns a Shared daemon that has not started yet.
func NewShared() *Shared { return &Shared{} }

// Start returns the shared daemon, starting it on first use. Without incusd
// (or root, or a static busybox) it skips the test, or fails it when
// CI=true.
func (s *Shared) Start(t testing.TB) *Daemon {
	t.Helper()
	s.once.Do(func() { s.d, s.skip, s.err = start() })
	if s.skip != "" {
		skipOrFail(t, s.skip)
	}
	if s.err != nil {
		t.Fatalf("incustest: %v", s.err)
	}
	return s.d
}

// Run runs the tests and then stops the daemon if one was started. Call it
// from TestMain: os.Exit(shared.Run(m)).
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if s.d != nil {
		if err := s.d.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "incustest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

func skipOrFail(t testing.TB, reason string) {
	t.Helper()
	testbin.Missing(t, "incustest: "+reason, "install with: "+InstallHint)
}

// findIncusd locates the daemon binary; Debian installs it outside PATH.
func findIncusd() (string, error) {
	if p := os.Getenv("INCUSD"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$INCUSD: %w", err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("incusd"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/libexec/incus/incusd", "/usr/lib/incus/incusd", "/usr/sbin/incusd", "/opt/incus/bin/incusd"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("incusd not found (looked at $INCUSD, PATH, /usr/libexec/incus, /usr/lib/incus, /usr/sbin, /opt/incus/bin)")
}

// findBusybox locates a static busybox ($INCUSTEST_BUSYBOX or /bin/busybox).
func findBusybox() (string, error) {
	p := os.Getenv("INCUSTEST_BUSYBOX")
	if p == "" {
		p = "/bin/busybox"
	}
	if err := checkStatic(p); err != nil {
		return "", fmt.Errorf("no static busybox: %w", err)
	}
	return p, nil
}

// prerequisites finds what any test daemon needs on this host: root, incusd and a
// static busybox (made into the image). A non-empty skip says which is missing; err is
// a real failure.
func prerequisites() (incusd string, image []byte, skip string, err error) {
	if os.Geteuid() != 0 {
		return "", nil, "not running as root (incusd needs root)", nil
	}
	incusd, err = findIncusd()
	if err != nil {
		return "", nil, err.Error(), nil
	}
	busybox, err := findBusybox()
	if err != nil {
		return "", nil, err.Error(), nil
	}
	image, err = busyboxImage(busybox)
	if err != nil {
		return "", nil, "", fmt.Errorf("build busybox image: %w", err)
	}
	return incusd, image, "", nil
}

// stateDir makes a fresh directory under /tmp for daemons' INCUS_DIR. Like
// /var/lib/incus, unprivileged containers' root must traverse it.
func stateDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("/tmp", prefix)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", errors.Join(err, os.RemoveAll(dir))
	}
	return dir, nil
}

// start starts and prepares a daemon. A non-empty skip says why the host
// cannot run one (a missing prerequisite); err is a real failure.
func start() (d *Daemon, skip string, err error) {
	incusd, image, skip, err := prerequisites()
	if skip != "" || err != nil {
		return nil, skip, err
	}
	dir, err := stateDir("incus-")
	if err != nil {
		return nil, "", err
	}
	d, err = spawn(incusd, dir)
	if err != nil {
		return nil, "", errors.Join(err, os.RemoveAll(dir))
	}
	if err := d.setup(image); err != nil {
		return nil, "", errors.Join(err, d.Close())
	}
	return d, "", nil
}

// spawn starts an incusd on dir (its INCUS_DIR), logging to dir/incusd.log (appended:
// a restarted cluster member keeps its earlier log), without waiting for it: the one
// way a single daemon and each cluster member start.
func spawn(incusd, dir string) (*Daemon, error) {
	logf, err := os.OpenFile(filepath.Join(dir, "incusd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(incusd, "--group", "root", "--verbose")
	cmd.Env = append(os.Environ(), "INCUS_DIR="+dir)
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Own process group (no terminal signals); if the test binary dies, the
	// daemon shuts down cleanly (SIGPWR also stops its containers).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGPWR}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", incusd, err)
	}
	d := &Daemon{Dir: dir, Socket: filepath.Join(dir, "unix.socket"), cmd: cmd, exited: make(chan struct{}), logf: logf}
	go func() { _ = cmd.Wait(); close(d.exited) }()
	d.Client = incus.New(d.Socket)
	return d, nil
}

// waitReady waits until the daemon answers, or reports its exit with its log.
func (d *Daemon) waitReady(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan error, 1)
	go func() { ready <- d.Client.WaitReady(rctx) }()
	select {
	case err := <-ready:
		if err != nil {
			return fmt.Errorf("incusd did not become ready: %w\n%s", err, d.LogTail(40))
		}
		return nil
	case <-d.exited:
		return fmt.Errorf("incusd exited during startup (%v)\n%s", d.cmd.ProcessState, d.LogTail(40))
	}
}

// setup waits for the daemon and creates the pool, the profile's root disk
// and the image.
func (d *Daemon) setup(image []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := d.waitReady(ctx); err != nil {
		return err
	}
	if err := defaultStorage(ctx, d.Client); err != nil {
		return fmt.Errorf("%w\n%s", err, d.LogTail(20))
	}
	fp, err := d.Client.ImportImage(ctx, bytes.NewReader(image), nil, ImageAlias)
	if err != nil {
		return fmt.Errorf("import busybox image: %w\n%s", err, d.LogTail(20))
	}
	d.Image, d.ImageFingerprint = ImageAlias, fp
	return nil
}

// defaultStorage creates the "dir" pool named "default" and gives the default profile
// its root disk there (no network: instances need none).
func defaultStorage(ctx context.Context, c *incus.Client) error {
	if err := c.Query(ctx, "POST", "/1.0/storage-pools", map[string]any{
		"name": "default", "driver": "dir",
	}, nil); err != nil {
		return fmt.Errorf("create storage pool: %w", err)
	}
	if err := c.Query(ctx, "PATCH", "/1.0/profiles/default", map[string]any{
		"devices": map[string]map[string]string{
			"root": {"type": "disk", "path": "/", "pool": "default"},
		},
	}, nil); err != nil {
		return fmt.Errorf("add root disk to default profile: %w", err)
	}
	return nil
}

// InstanceName returns a name for a new instance, unique across daemons on
// this host (LXC names cgroups after instances, so two test daemons must not
// reuse names), and registers a cleanup that kills and deletes the instance
// if it still exists when the test ends.
func (d *Daemon) InstanceName(t testing.TB) string {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := "t-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if d.closed() {
			return // Close removed it with the rest
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := d.removeInstance(ctx, name); err != nil {
			t.Errorf("incustest: remove instance %s: %v", name, err)
		}
	})
	return name
}

// removeInstance kills and deletes an instance; a missing one is fine.
func (d *Daemon) removeInstance(ctx context.Context, name string) error {
	inst, _, err := d.Client.GetInstance(ctx, name)
	if incus.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if inst.StatusCode != incus.StatusStopped {
		if err := d.Client.Kill(ctx, name); err != nil {
			return err
		}
	}
	if err := d.Client.DeleteInstance(ctx, name); err != nil && !incus.IsNotFound(err) {
		return err
	}
	return nil
}

// removeInstances kills and deletes every instance the daemon (or, through a cluster
// member, the cluster) has.
func (d *Daemon) removeInstances(ctx context.Context) []error {
	var urls []string
	if err := d.Client.Query(ctx, "GET", "/1.0/instances", nil, &urls); err != nil {
		return []error{fmt.Errorf("list instances: %w", err)}
	}
	var errs []error
	for _, u := range urls {
		name := u[strings.LastIndex(u, "/")+1:]
		if err := d.removeInstance(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("remove instance %s: %w", name, err))
		}
	}
	return errs
}

// stop shuts the daemon down, SIGPWR (it stops its instances, unmounts and exits),
// killing it past shutdownTimeout, and closes its log; d.mu is held.
func (d *Daemon) stop() error {
	var err error
	select {
	case <-d.exited:
	default:
		_ = d.cmd.Process.Signal(syscall.SIGPWR)
		select {
		case <-d.exited:
		case <-time.After(shutdownTimeout):
			_ = d.cmd.Process.Kill()
			<-d.exited
			err = fmt.Errorf("incusd did not shut down within %s; killed\n%s", shutdownTimeout, d.LogTail(20))
		}
	}
	d.cmd = nil
	d.logf.Close()
	return err
}

// Close deletes all instances, shuts the daemon down, unmounts what it left
// mounted and removes its directory. It is safe to call more than once.
func (d *Daemon) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return nil
	}
	var errs []error
	select {
	case <-d.exited:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		errs = d.removeInstances(ctx)
		cancel()
	}
	if err := d.stop(); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(d.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(d.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", d.Dir, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down incusd in %s: %w", d.Dir, err)
	}
	return nil
}

// unmountUnder lazily unmounts every mount point at or below dir, deepest
// first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes the octal escapes (\040 etc.) of /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// LogTail returns the last n lines of the daemon's log, for failure messages.
func (d *Daemon) LogTail(n int) string {
	data, err := os.ReadFile(filepath.Join(d.Dir, "incusd.log"))
	if err != nil {
		return "(no incusd log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "incusd log (last lines):\n" + strings.Join(lines, "\n")
}

var _ io.Closer = (*Daemon)(nil)
