package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/proc"
)

func TestIncusEndpoint(t *testing.T) {
	t.Parallel()
	proxy := func(listen, connect string, extra ...string) map[string]string {
		d := map[string]string{"type": "proxy", "listen": listen, "connect": connect}
		for i := 0; i+1 < len(extra); i += 2 {
			d[extra[i]] = extra[i+1]
		}
		return d
	}
	eth0 := &incus.InstanceState{Network: map[string]incus.NetworkState{
		"lo":   {Addresses: []incus.NetworkAddress{{Family: "inet", Address: "127.0.0.1", Scope: "local"}}},
		"eth0": {Addresses: []incus.NetworkAddress{{Family: "inet6", Address: "fd42::5", Scope: "global"}, {Family: "inet", Address: "10.0.3.5", Scope: "global"}}},
	}}
	for _, tt := range []struct {
		name    string
		devices map[string]map[string]string
		state   *incus.InstanceState
		want    string
	}{
		{"proxy", map[string]map[string]string{"api": proxy("tcp:127.0.0.1:18000", "tcp:127.0.0.1:30000")}, nil, "127.0.0.1:18000"},
		{"proxy on any address", map[string]map[string]string{"api": proxy("tcp:0.0.0.0:18000", "tcp:0.0.0.0:30000")}, eth0, "127.0.0.1:18000"},
		{"ipv6 proxy", map[string]map[string]string{"api": proxy("tcp:[::1]:18000", "tcp:[::1]:30000")}, nil, "[::1]:18000"},
		{"other port, then the address", map[string]map[string]string{"api": proxy("tcp:127.0.0.1:18000", "tcp:127.0.0.1:8080")}, eth0, "10.0.3.5:30000"},
		{"bind = container is the other way", map[string]map[string]string{"api": proxy("tcp:127.0.0.1:18000", "tcp:127.0.0.1:30000", "bind", "container")}, nil, ""},
		{"udp", map[string]map[string]string{"api": proxy("udp:127.0.0.1:18000", "udp:127.0.0.1:30000")}, nil, ""},
		{"nothing", map[string]map[string]string{"root": {"type": "disk", "path": "/"}}, &incus.InstanceState{}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IncusEndpoint(&incus.Instance{Name: "c", ExpandedDevices: tt.devices}, tt.state, 30000)
			if got != tt.want || (tt.want == "") != (err != nil) {
				t.Errorf("IncusEndpoint = %q, %v; want %q", got, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), `connect = "tcp:127.0.0.1:30000"`) {
				t.Errorf("the error does not say how to add a proxy: %v", err)
			}
		})
	}
}

func TestIncusEnviron(t *testing.T) {
	t.Parallel()
	r := &Incus{}
	got := r.environ(Spec{Env: map[string]string{"B": "x y", "PATH": "/opt/bin"}, Marker: "AGENT_SERVER=s#1"}, "/root")
	want := "B=x y,FLASHINFER_WORKSPACE_BASE=/root,HOME=/root,PATH=/opt/bin,TORCHINDUCTOR_CACHE_DIR=/root/.cache/torchinductor,TRITON_CACHE_DIR=/root/.cache/triton,AGENT_SERVER=s#1"
	if strings.Join(got, ",") != want {
		t.Errorf("environ = %q, want %q", got, want)
	}
}

// The recorded generation ran in a container that no longer exists (the plan moved the
// server to the host, the container was deleted). Stopping what is left of it is done:
// nothing is left, and no port is held. Found in review: the port check's 404 failed
// every apply, so the server could never be launched elsewhere.
func TestStopInADeletedContainerIsDone(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "incus.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"type":"error","error":"Instance not found","error_code":404}`))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	// The old generation's leader: a real process, gone (reaped) by now.
	cmd := exec.Command("true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	id, _ := proc.FS{}.Identify(cmd.Process.Pid)
	_ = cmd.Wait()

	r := &Incus{Client: incus.New(sock), Instance: "old"}
	if _, err := r.Init(context.Background()); !errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "container old does not exist") {
		t.Errorf("Init = %v, want ErrNotRunning saying the container does not exist", err)
	}
	lc := &Lifecycle{Place: r}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if rep, err := lc.Stop(ctx, proc.Target{Leader: id, PGID: id.PID, SID: id.PID, Marker: "AGENT_SERVER=x#1@1"}, syscall.SIGTERM, time.Second, 30000); err != nil {
		t.Fatalf("Stop = %v (report %+v), want done", err, rep)
	}
}

// identify gives up on a launch it found by its tag but that never stopped: it returns
// that process's identity with the error, so that Start kills it instead of leaving a
// shell that will exec the server unrecorded (found in review). A process that is not
// the launch is never returned.
func TestIdentifyReturnsTheTaggedLaunchItGaveUpOn(t *testing.T) {
	t.Parallel()
	const tag = "agent-launch-7f3a"
	for _, tc := range []struct {
		name    string
		argv    string
		wantPID int
	}{
		{"the launch, running instead of stopped", "sh\x00-c\x00" + stoppedScript + "\x00" + tag + "\x00", 5000},
		{"someone else at that pid", "sleep\x00300\x00", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			addProc := func(pid, nsPID int, state, argv string) {
				dir := filepath.Join(root, strconv.Itoa(pid))
				must := func(err error) {
					if err != nil {
						t.Fatal(err)
					}
				}
				must(os.MkdirAll(filepath.Join(dir, "ns"), 0o755))
				must(os.Symlink("pid:[4026532999]", filepath.Join(dir, "ns", "pid")))
				must(os.WriteFile(filepath.Join(dir, "status"), fmt.Appendf(nil, "Name:\tx\nNSpid:\t%d\t%d\n", pid, nsPID), 0o644))
				must(os.WriteFile(filepath.Join(dir, "cmdline"), []byte(argv), 0o644))
				stat := fmt.Sprintf("%d (x) %s 1 %d %d 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n", pid, state, pid, pid)
				must(os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644))
			}
			addProc(100, 1, "S", "/sbin/init\x00")
			addProc(5000, 12, "S", tc.argv) // never reaches state T
			r := &Incus{Instance: "c", Proc: proc.FS{Root: root}}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			id, _, err := r.identify(ctx, proc.Identity{PID: 100, StartTicks: 777}, 12, tag)
			if err == nil {
				t.Fatal("identify succeeded on a launch that never stopped")
			}
			if id.PID != tc.wantPID {
				t.Errorf("identify returned pid %d (%v), want %d", id.PID, err, tc.wantPID)
			}
		})
	}
}
