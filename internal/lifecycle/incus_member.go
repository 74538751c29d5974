package lifecycle

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// errElsewhere is wrapped when the instance's init process is not on this host.
var errElsewhere = errors.New("the instance's processes are not on this host")

// checkInit proves that the host process pid is the instance's init: it sits in the
// instance's LXC cgroup (lxc.payload.NAME, or lxc.payload.PROJECT_NAME). Incus reports
// the init PID in the namespace of the host the instance runs on; on an Incus cluster
// that is the member holding it, and the same number on this host is some unrelated
// process that must never be observed or signalled as the server's. The Incus place uses
// this host's /proc only for an instance Incus places on this member (Incus.remote);
// this proof catches a placement that says so wrongly. A procfs without
// cgroup files (a test's fake) proves nothing either way and is let through.
func (r *Incus) checkInit(pid int) error {
	data, err := os.ReadFile(r.procRoot() + "/" + strconv.Itoa(pid) + "/cgroup")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("container %s: read the cgroup of its init pid %d: %w", r.Instance, pid, err)
	}
	if inInstanceCgroup(data, r.Instance) {
		return nil
	}
	return fmt.Errorf("container %s: Incus says its init is pid %d, but that process on this host is not in the instance's cgroup (lxc.payload.%s): the instance runs elsewhere, though its location names the member of the agent's Incus socket; nothing was observed or signalled (docs/containers.md, \"Servers on another member\"): %w",
		r.Instance, pid, r.Instance, errElsewhere)
}

// inInstanceCgroup reports whether a /proc/PID/cgroup file places the process in the
// instance's cgroup or below it (systemd inside puts init in init.scope).
func inInstanceCgroup(data []byte, instance string) bool {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, seg := range strings.Split(parts[2], "/") {
			rest, ok := strings.CutPrefix(seg, "lxc.payload.")
			if ok && (rest == instance || strings.HasSuffix(rest, "_"+instance)) {
				return true
			}
		}
	}
	return false
}
