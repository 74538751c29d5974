package fleet_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agent-dev/agent/internal/testbin"
)

// The hosts of an upgrade (newUpgrade) and of the drain tests are separate machines to
// their agents: each agent, and all it launches, runs in its own UTS and mount
// namespaces. Its hostname is the host's name (the upgrade's plan does not repeat it:
// coordination's name defaults to it), and its own directory (host root, state directory, the reboot hook's marks) is mounted on
// one shared path: every agent is given the same AGENT_HOST_ROOT and --state-dir, and
// each sees its own host there, as the same paths on three machines would be.
//
// The test binary itself enters the namespaces' inside: started again with the clone
// flags and the variables below, TestMain sets the hostname, binds the host's directory
// and execs the agent (its PID and process group stay the agent's).
const (
	nsHostname = "FLEET_TEST_HOSTNAME" // the host's name
	nsHostDir  = "FLEET_TEST_HOST_DIR" // its own directory
	nsMount    = "FLEET_TEST_MOUNT"    // the shared path it is mounted on
)

func TestMain(m *testing.M) {
	if name := os.Getenv(nsHostname); name != "" {
		enterHost(name, os.Getenv(nsHostDir), os.Getenv(nsMount), os.Args[1:])
	}
	os.Exit(m.Run())
}

// enterHost runs in the new namespaces: hostname, private mounts (nothing propagates
// back to the machine), the bind, then exec argv. It never returns.
func enterHost(name, dir, mount string, argv []string) {
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "test host %s: %s: %v\n", name, what, err)
		os.Exit(127)
	}
	if err := syscall.Sethostname([]byte(name)); err != nil {
		fail("sethostname", err)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		fail("make the mounts private", err)
	}
	if err := syscall.Mount(dir, mount, "", syscall.MS_BIND, ""); err != nil {
		fail("bind "+dir+" on "+mount, err)
	}
	for _, v := range []string{nsHostname, nsHostDir, nsMount} {
		os.Unsetenv(v)
	}
	if err := syscall.Exec(argv[0], argv, os.Environ()); err != nil {
		fail("exec "+argv[0], err)
	}
}

// hostNamespaces gives every host of h its own UTS and mount namespaces (above), its
// directory h.work/NAME mounted on h.work/host; it needs root (CAP_SYS_ADMIN): without
// it the test is skipped, and fails under CI=true.
func (h *harness) hostNamespaces() {
	h.t.Helper()
	if os.Geteuid() != 0 {
		testbin.Missing(h.t, "a host's own UTS and mount namespaces need root", "run as root")
	}
	h.nsMount = filepath.Join(h.work, "host")
	if err := os.MkdirAll(h.nsMount, 0o755); err != nil {
		h.t.Fatal(err)
	}
}

// hostPath is what x's agent calls the path p under x's own directory: under the shared
// mount in its namespaces, else p itself.
func (h *harness) hostPath(x *host, p string) string {
	if h.nsMount == "" {
		return p
	}
	rel, err := filepath.Rel(filepath.Join(h.work, x.name), p)
	if err != nil {
		h.t.Fatal(err)
	}
	return filepath.Join(h.nsMount, rel)
}

// command is `agent ARGS...` as x: in x's namespaces when the hosts have them, in a
// process group of its own either way.
func (h *harness) command(x *host, args ...string) *exec.Cmd {
	cmd := exec.Command(h.agentBin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(append(os.Environ(), "HOME="+h.work), x.env...)
	if h.nsMount != "" {
		self, err := os.Executable()
		if err != nil {
			h.t.Fatal(err)
		}
		cmd.Path, cmd.Args = self, append([]string{self, h.agentBin}, args...)
		cmd.Env = append(cmd.Env, nsHostname+"="+x.name, nsHostDir+"="+filepath.Join(h.work, x.name), nsMount+"="+h.nsMount)
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUTS | syscall.CLONE_NEWNS
	}
	return cmd
}
