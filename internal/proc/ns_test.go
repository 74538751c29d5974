package proc

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseNSpid(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, status string
		want         []int
		bad          bool
	}{
		{"host", "Name:\tbash\nNSpid:\t4228\nNSpgid:\t4228\n", []int{4228}, false},
		{"container", "Name:\tfake\nTgid:\t81234\nNSpid:\t81234\t57\n", []int{81234, 57}, false},
		{"nested", "NSpid:\t9\t8\t1\n", []int{9, 8, 1}, false},
		{"old kernel", "Name:\tx\nPid:\t3\n", nil, true},
		{"garbage", "NSpid:\t12\tx\n", nil, true},
		{"empty", "NSpid:\n", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseNSpid([]byte(tt.status), 1)
			if (err != nil) != tt.bad || !slices.Equal(got, tt.want) {
				t.Errorf("parseNSpid = %v, %v; want %v (error %v)", got, err, tt.want, tt.bad)
			}
		})
	}
}

// nsTree is a fake procfs with a container: init 200 and its process 201 (7 inside),
// in a PID namespace other than the host's 100, and 201 listening on a port in the
// container's network namespace only.
func nsTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, body string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(rel, target string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	header := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	// 127.0.0.1:30000 (0x7530) listening, inode 777.
	listen := "   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0\n"
	write("100/status", "Name:\tinit\nNSpid:\t100\n")
	link("100/ns/pid", "pid:[4026531836]")
	write("100/net/tcp", header)
	write("200/status", "Name:\tinit\nNSpid:\t200\t1\n")
	link("200/ns/pid", "pid:[4026532999]")
	write("200/net/tcp", header+listen)
	write("200/net/tcp6", header)
	write("201/status", "Name:\tfake\nNSpid:\t201\t7\n")
	link("201/ns/pid", "pid:[4026532999]")
	link("201/fd/3", "socket:[777]")
	write("300/status", "Name:\tother\nNSpid:\t300\t7\n") // pid 7 of another container
	link("300/ns/pid", "pid:[4026533111]")
	link("300/fd/3", "socket:[778]")
	return root
}

func TestPIDIn(t *testing.T) {
	t.Parallel()
	fs := FS{Root: nsTree(t)}
	for _, tt := range []struct{ ref, ns, want int }{{200, 7, 201}, {200, 1, 200}, {100, 100, 100}} {
		if got, err := fs.PIDIn(tt.ref, tt.ns); err != nil || got != tt.want {
			t.Errorf("PIDIn(%d, %d) = %d, %v; want %d", tt.ref, tt.ns, got, err, tt.want)
		}
	}
	if _, err := fs.PIDIn(200, 9); !errors.Is(err, ErrNotInNamespace) {
		t.Errorf("PIDIn(200, 9) = %v, want ErrNotInNamespace", err)
	}
	if _, err := fs.PIDIn(999, 1); !errors.Is(err, ErrNoProcess) {
		t.Errorf("PIDIn(999, 1) = %v, want ErrNoProcess", err)
	}
	// The real /proc: this process is itself in its own namespace.
	self := os.Getpid()
	ids, err := FS{}.NSpid(self)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := (FS{}).PIDIn(self, ids[len(ids)-1]); err != nil || got != self {
		t.Errorf("PIDIn(self) = %d, %v; want %d", got, err, self)
	}
}

func TestPortOwnersInNamespace(t *testing.T) {
	t.Parallel()
	fs := FS{Root: nsTree(t)}
	if got, err := fs.PortOwnersIn(200, 30000); err != nil || !slices.Equal(got, []int{201}) {
		t.Errorf("PortOwnersIn(200) = %v, %v; want [201]", got, err)
	}
	// The host's table (pid 100's namespace) does not show it.
	if got, err := fs.PortOwnersIn(100, 30000); err != nil || len(got) != 0 {
		t.Errorf("PortOwnersIn(100) = %v, %v; want none", got, err)
	}
	err := fs.PortFreeIn(t.Context(), 200, 30000, 50*time.Millisecond)
	if !errors.Is(err, ErrPortHeld) || !strings.Contains(err.Error(), "pid 201") {
		t.Errorf("PortFreeIn(200) = %v, want ErrPortHeld naming pid 201", err)
	}
	if err := fs.PortFreeIn(t.Context(), 200, 30001, time.Second); err != nil {
		t.Errorf("PortFreeIn(200, another port) = %v", err)
	}
	// A namespace whose process is gone (a stopped container) holds nothing.
	if err := fs.PortFreeIn(t.Context(), 999, 30000, time.Second); err != nil {
		t.Errorf("PortFreeIn(gone) = %v", err)
	}
	if _, err := fs.PortOwnersIn(999, 30000); !errors.Is(err, ErrNoProcess) {
		t.Errorf("PortOwnersIn(gone) = %v, want ErrNoProcess", err)
	}

	// The real /proc: this process's own namespace, by its PID, agrees with PortOwners.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	got, err := FS{}.PortOwnersIn(os.Getpid(), port)
	if err != nil || !slices.Contains(got, os.Getpid()) {
		t.Errorf("PortOwnersIn(self, %d) = %v, %v; want it to hold %d", port, got, err, os.Getpid())
	}
}
