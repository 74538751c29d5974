package proc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrPortHeld is wrapped when a port stays taken past the deadline.
var ErrPortHeld = errors.New("port still held")

// tcpListen is the st value of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// ListeningInodes returns the socket inodes of TCP sockets listening on
// port, on any address, read from net/tcp and net/tcp6 under the root.
// Those tables describe one network namespace: the reader's own for
// /proc/net (a link to self/net). A server in a container with a network
// namespace of its own does not show there: see ListeningInodesIn.
func (fs FS) ListeningInodes(port int) ([]uint64, error) {
	return listeningInodes(fs.path("net"), port)
}

// ListeningInodesIn is ListeningInodes in the network namespace of process
// netPID (an Incus container's init): its /proc/PID/net tables. Socket inodes
// are global, so socketOwners still finds their holders under the root.
func (fs FS) ListeningInodesIn(netPID, port int) ([]uint64, error) {
	if netPID <= 0 {
		return fs.ListeningInodes(port)
	}
	inodes, err := listeningInodes(fs.pidPath(netPID, "net"), port)
	if err != nil && gone(err) {
		return nil, fmt.Errorf("pid %d: %w", netPID, ErrNoProcess)
	}
	return inodes, err
}

func listeningInodes(dir string, port int) ([]uint64, error) {
	var inodes []uint64
	for _, name := range []string{"tcp", "tcp6"} {
		f, err := os.Open(dir + "/" + name)
		if errors.Is(err, os.ErrNotExist) && name == "tcp6" {
			if _, derr := os.Stat(dir); derr == nil {
				continue // IPv6 disabled
			}
		}
		if err != nil {
			return nil, fmt.Errorf("listening sockets: %w", err)
		}
		got, err := parseListening(f, port)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("listening sockets: %s: %w", name, err)
		}
		inodes = append(inodes, got...)
	}
	return inodes, nil
}

// parseListening reads a /proc/net/tcp{,6} table and returns the inodes of
// LISTEN entries on port. Lines it cannot read are skipped: the kernel's
// format is fixed, and a torn last line must not hide the rest.
func parseListening(r io.Reader, port int) ([]uint64, error) {
	var inodes []uint64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		f := bytes.Fields(sc.Bytes())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 || string(f[3]) != tcpListen {
			continue
		}
		_, hexPort, ok := bytes.Cut(f[1], []byte(":"))
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(string(hexPort), 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		inode, err := strconv.ParseUint(string(f[9]), 10, 64)
		if err != nil || inode == 0 {
			continue
		}
		inodes = append(inodes, inode)
	}
	return inodes, sc.Err()
}

// PortOwners returns the PIDs holding a TCP socket that listens on port, in
// PID order: the listening inodes from net/tcp{,6}, matched against the
// socket:[inode] links under every /proc/PID/fd. Processes or descriptors
// that cannot be read (gone, or not ours to read) are skipped, so the answer
// may be incomplete without root; PortFree does not rely on it alone.
func (fs FS) PortOwners(port int) ([]int, error) {
	inodes, err := fs.ListeningInodes(port)
	if err != nil || len(inodes) == 0 {
		return nil, err
	}
	return fs.socketOwners(inodes)
}

// PortOwnersIn is PortOwners in the network namespace of process netPID (a
// container's init): the listeners of its net/tcp{,6}, matched against the
// descriptors of every process under the root, so the PIDs are the root's.
func (fs FS) PortOwnersIn(netPID, port int) ([]int, error) {
	inodes, err := fs.ListeningInodesIn(netPID, port)
	if err != nil || len(inodes) == 0 {
		return nil, err
	}
	return fs.socketOwners(inodes)
}

func (fs FS) socketOwners(inodes []uint64) ([]int, error) {
	want := make(map[string]bool, len(inodes))
	for _, ino := range inodes {
		want["socket:["+strconv.FormatUint(ino, 10)+"]"] = true
	}
	entries, err := os.ReadDir(fs.root())
	if err != nil {
		return nil, fmt.Errorf("socket owners: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := fs.pidPath(pid, "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or permission denied
		}
		for _, fd := range fds {
			link, err := os.Readlink(fdDir + "/" + fd.Name())
			if err == nil && want[link] {
				pids = append(pids, pid)
				break
			}
		}
	}
	slices.Sort(pids)
	return pids, nil
}

// PortFree waits until nothing listens on TCP port, up to wait or until ctx
// is done. Free means both that net/tcp{,6} shows no listener on the port
// and that binding 127.0.0.1:port succeeds (the bind is closed at once), so
// a listener this process cannot see still counts as holding it. The error
// wraps ErrPortHeld and names the holder PIDs with their command lines, or
// says the holder could not be seen.
func (fs FS) PortFree(ctx context.Context, port int, wait time.Duration) error {
	return fs.PortFreeIn(ctx, 0, port, wait)
}

// PortFreeIn is PortFree in the network namespace of process netPID (a
// container's init; 0: this process's own). There, free means that its
// net/tcp{,6} shows no listener on the port: the agent cannot bind inside
// another namespace, so there is no bind check. A namespace whose process is
// gone (the container stopped) holds nothing.
func (fs FS) PortFreeIn(ctx context.Context, netPID, port int, wait time.Duration) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d: out of range", port)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	// Cheap polls: only the listening table (and a bind) each time, at an interval
	// that grows to portPollMax; who holds the port (a walk of every process's
	// descriptors) is read once, for the error. A takeover or a stop can wait here for
	// seconds, and a walk every 25 ms cost seconds of system CPU.
	interval := pollInterval
	for {
		busy, err := fs.portBusy(netPID, port)
		if errors.Is(err, ErrNoProcess) && netPID > 0 {
			return nil // its namespace is gone, and every socket in it
		}
		if err == nil && !busy {
			return nil
		}
		select {
		case <-ctx.Done():
			held, _ := fs.portHeld(netPID, port)
			return fmt.Errorf("port %d: %w: %s: %w", port, ErrPortHeld, held, ctx.Err())
		case <-timer.C:
			if err != nil {
				return fmt.Errorf("port %d: %w", port, err)
			}
			held, herr := fs.portHeld(netPID, port)
			if herr == nil && held == "" {
				return nil // freed as the wait ended
			}
			return fmt.Errorf("port %d: %w after %s: %s", port, ErrPortHeld, wait, held)
		case <-time.After(interval):
			interval = min(interval*2, portPollMax)
		}
	}
}

// portPollMax bounds the interval of PortFree's polls.
const portPollMax = 200 * time.Millisecond

// portBusy reports whether port is held, cheaply: a listener in net/tcp{,6}, or (in this
// process's own namespace) a failing bind of 127.0.0.1:port.
func (fs FS) portBusy(netPID, port int) (bool, error) {
	inodes, err := fs.ListeningInodesIn(netPID, port)
	if err != nil {
		return false, err
	}
	if len(inodes) > 0 {
		return true, nil
	}
	if netPID > 0 {
		return false, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return true, nil
	}
	if err := l.Close(); err != nil {
		return false, fmt.Errorf("close probe listener: %w", err)
	}
	return false, nil
}

// portHeld returns "" when port is free, else who holds it, for the error.
func (fs FS) portHeld(netPID, port int) (string, error) {
	inodes, err := fs.ListeningInodesIn(netPID, port)
	if err != nil {
		return "", err
	}
	if len(inodes) > 0 {
		pids, err := fs.socketOwners(inodes)
		if err != nil {
			return "", err
		}
		if len(pids) == 0 {
			return fmt.Sprintf("listening socket inode %v, owner not visible", inodes), nil
		}
		parts := make([]string, 0, len(pids))
		for _, pid := range pids {
			d := "pid " + strconv.Itoa(pid)
			if argv, err := fs.Cmdline(pid); err == nil && len(argv) > 0 {
				d += " " + strconv.Quote(strings.Join(argv, " "))
			}
			parts = append(parts, d)
		}
		return "held by " + strings.Join(parts, ", "), nil
	}
	if netPID > 0 {
		return "", nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return "bind 127.0.0.1: " + err.Error(), nil
	}
	if err := l.Close(); err != nil {
		return "", fmt.Errorf("close probe listener: %w", err)
	}
	return "", nil
}

// ParseListening reads one /proc/net/tcp or tcp6 table (its header line first) and
// returns the inodes of the sockets listening on port: for tables read elsewhere than
// under a procfs root (inside a container, through its manager's API).
func ParseListening(r io.Reader, port int) ([]uint64, error) { return parseListening(r, port) }
