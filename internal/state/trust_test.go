package state

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-dev/agent/internal/trust"
)

// asNobody runs a command as the unprivileged user nobody, as another local user would.
func asNobody(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command("setpriv", append([]string{"--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("as nobody: %v: %v\n%s", args, err, out)
	}
}

// openDir is a root-owned 0755 directory right under the sticky /tmp, so that nobody can
// reach what a test gives them (t.TempDir's parent is 0700).
func openDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "state-trust-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(d, 0o755)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("these tests prove what a root agent refuses; run them as root (CI does)")
	}
}

// A state directory another user owns, or that group or others may write, is refused
// with the fix, and left as it was: never tightened and then trusted (issue 13, 1).
func TestOpenRefusesStateDirOthersCouldWrite(t *testing.T) {
	needRoot(t)
	t.Parallel()
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, base string) (dir, culprit string)
		fix   string
	}{
		{"owned by nobody", func(t *testing.T, base string) (string, string) {
			d := filepath.Join(base, "state")
			os.Mkdir(d, 0o700)
			os.Chown(d, 65534, 65534)
			return d, d
		}, "chown root:root "},
		{"group-writable", func(t *testing.T, base string) (string, string) {
			d := filepath.Join(base, "state")
			os.Mkdir(d, 0o700)
			os.Chmod(d, 0o770)
			return d, d
		}, "chmod go-w "},
		{"sticky but the dir itself", func(t *testing.T, base string) (string, string) {
			d := filepath.Join(base, "state")
			os.Mkdir(d, 0o700)
			os.Chmod(d, 0o777|os.ModeSticky)
			return d, d
		}, "chmod go-w "},
		{"a parent owned by nobody", func(t *testing.T, base string) (string, string) {
			p := filepath.Join(base, "p")
			os.Mkdir(p, 0o755)
			os.Chown(p, 65534, 65534)
			d := filepath.Join(p, "state")
			os.Mkdir(d, 0o700)
			return d, p
		}, "chown root:root "},
		{"a missing dir under a writable parent", func(t *testing.T, base string) (string, string) {
			p := filepath.Join(base, "p")
			os.Mkdir(p, 0o777)
			os.Chmod(p, 0o777)
			return filepath.Join(p, "state"), p
		}, "chmod go-w "},
		{"resources a symlink", func(t *testing.T, base string) (string, string) {
			d := filepath.Join(base, "state")
			os.Mkdir(d, 0o700)
			os.Mkdir(filepath.Join(base, "elsewhere"), 0o700)
			os.Symlink(filepath.Join(base, "elsewhere"), filepath.Join(d, "resources"))
			return d, filepath.Join(d, "resources")
		}, "rm "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			base := t.TempDir()
			dir, culprit := tc.setup(t, base)
			before, _ := os.Lstat(culprit)
			_, err := Open(dir)
			if !errors.Is(err, trust.ErrUntrusted) || !strings.Contains(err.Error(), tc.fix+culprit) {
				t.Fatalf("Open = %v, want a refusal ending with %q", err, tc.fix+culprit)
			}
			if after, _ := os.Lstat(culprit); before != nil && after.Mode() != before.Mode() {
				t.Errorf("mode of %s changed from %v to %v: a refused dir must be left as it was", culprit, before.Mode(), after.Mode())
			}
		})
	}
	// A root-owned sticky parent (/tmp) is fine.
	t.Run("under a sticky root dir", func(t *testing.T) {
		t.Parallel()
		p := filepath.Join(t.TempDir(), "tmp")
		os.Mkdir(p, 0o777)
		os.Chmod(p, 0o777|os.ModeSticky)
		if _, err := Open(filepath.Join(p, "state")); err != nil {
			t.Fatal(err)
		}
	})
}

// A lock symlink planted by another user never makes the agent truncate its target:
// planted by nobody in a directory they owned, then refused with the directory; and in a
// trusted directory (planted before it was made safe, or by a root mistake), refused by
// O_NOFOLLOW. A hard link to a root file is refused as well.
func TestLockNeverWritesThroughAPlantedLink(t *testing.T) {
	needRoot(t)
	t.Parallel()
	base := openDir(t)
	target := filepath.Join(base, "precious")
	const content = "root's file\n"
	os.WriteFile(target, []byte(content), 0o644)

	loose := filepath.Join(base, "loose")
	os.Mkdir(loose, 0o755)
	os.Chown(loose, 65534, 65534)
	asNobody(t, "ln", "-s", target, filepath.Join(loose, "lock"))
	if _, err := Open(loose); !errors.Is(err, trust.ErrUntrusted) {
		t.Errorf("Open of nobody's dir with a planted lock = %v", err)
	}

	s, err := Open(filepath.Join(base, "state"))
	if err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(s.Dir(), "lock")
	os.Symlink(target, lock)
	if l, err := s.Acquire(context.Background(), 0, "agent plan"); err == nil || !strings.Contains(err.Error(), "rm "+lock) {
		l.Release()
		t.Errorf("Acquire through a symlink = %v, want a refusal", err)
	}
	os.Remove(lock)
	os.Link(target, lock)
	if l, err := s.Acquire(context.Background(), 0, "agent plan"); err == nil || !strings.Contains(err.Error(), "hard links") {
		l.Release()
		t.Errorf("Acquire through a hard link = %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(target); string(b) != content {
		t.Fatalf("the link's target was written: %q", b)
	}
}

// A record the agent did not write (a symlink, or a file others may write) is never read.
func TestLoadRefusesRecordsOthersCouldHaveWritten(t *testing.T) {
	needRoot(t)
	t.Parallel()
	base := t.TempDir()
	s, err := Open(filepath.Join(base, "state"))
	if err != nil {
		t.Fatal(err)
	}
	forged := filepath.Join(base, "forged.json")
	os.WriteFile(forged, []byte(`{"pid": 1}`), 0o600)
	rec := filepath.Join(s.Dir(), "resources", "server.qwen.json")
	os.Symlink(forged, rec)
	var v map[string]any
	if ok, err := s.Load("server.qwen", &v); ok || !errors.Is(err, trust.ErrUntrusted) {
		t.Errorf("Load through a symlink = %v, %v, %v", ok, v, err)
	}
	os.Remove(rec)
	os.WriteFile(rec, []byte(`{"pid": 1}`), 0o666)
	os.Chmod(rec, 0o666)
	if ok, err := s.Load("server.qwen", &v); ok || !strings.Contains(err.Error(), "chmod go-w "+rec) {
		t.Errorf("Load of a world-writable record = %v, %v, %v", ok, v, err)
	}
	os.Chmod(rec, 0o600)
	os.Chown(rec, 65534, 65534)
	if ok, err := s.Load("server.qwen", &v); ok || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Errorf("Load of nobody's record = %v, %v, %v", ok, v, err)
	}
}
