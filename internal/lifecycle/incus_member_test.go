package lifecycle

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agent-dev/agent/internal/proc"
)

// TestCheckInit: an init PID whose host process is in the instance's cgroup is the
// instance's; the same PID in another cgroup (the instance runs on another cluster
// member, and this host's PID is someone else's) is refused, never observed as ours.
func TestCheckInit(t *testing.T) {
	root := t.TempDir()
	write := func(pid, cgroup string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("100", "9:name=systemd:/lxc.payload.c1\n8:pids:/lxc.payload.c1\n0::/lxc.payload.c1\n")
	write("101", "0::/lxc.payload.proj_c1/init.scope\n")
	write("102", "0::/system.slice/sshd.service\n")
	write("103", "0::/lxc.payload.c10\n")
	r := &Incus{Instance: "c1", Proc: proc.FS{Root: root}}
	for pid, ok := range map[int]bool{100: true, 101: true, 102: false, 103: false, 999: true} {
		err := r.checkInit(pid)
		if ok != (err == nil) {
			t.Errorf("pid %d: %v, want ok=%v", pid, err, ok)
		}
		if err != nil && !errors.Is(err, errElsewhere) {
			t.Errorf("pid %d: %v does not wrap errElsewhere", pid, err)
		}
	}
}
