package incus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSocketPath(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	exists := filepath.Join(dir, "unix.socket")
	if err := os.WriteFile(exists, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.socket")
	tests := []struct {
		name, explicit, env string
		candidates          []string
		want                string
	}{
		{"explicit wins", "/x.sock", "/env.sock", []string{exists}, "/x.sock"},
		{"env next", "", "/env.sock", []string{exists}, "/env.sock"},
		{"first existing default", "", "", []string{missing, exists}, exists},
		{"none exists: first default", "", "", []string{missing, exists + ".no"}, missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := socketPath(tt.explicit, tt.env, tt.candidates); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestServer(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.mux.HandleFunc("GET /1.0", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, map[string]any{
			"api_version": "1.0", "auth": "trusted",
			"api_extensions": []string{"container_exec_recording", "instances"},
			"environment":    map[string]any{"driver": "lxc", "server_version": "6.0.4", "server_pid": 42},
		})
	})
	s, err := f.client.Server(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if s.APIVersion != "1.0" || s.Environment.ServerVersion != "6.0.4" || s.Environment.ServerPid != 42 {
		t.Errorf("server: %+v", s)
	}
	if !s.HasExtension("instances") || s.HasExtension("nope") {
		t.Error("HasExtension")
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handler http.HandlerFunc
		want    Error
	}{
		{"incus 404", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, 404, "Instance not found")
		}, Error{Method: "GET", Path: "/1.0/instances/c1", Status: 404, Message: "Instance not found"}},
		{"incus 500", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, 500, "Failed to fetch instance: database is locked")
		}, Error{Method: "GET", Path: "/1.0/instances/c1", Status: 500, Message: "Failed to fetch instance: database is locked"}},
		{"not json", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway", http.StatusBadGateway)
		}, Error{Method: "GET", Path: "/1.0/instances/c1", Status: 502, Message: "bad gateway"}},
		{"error envelope with HTTP 200", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, map[string]any{"type": "error", "error": "Forbidden", "error_code": 403})
		}, Error{Method: "GET", Path: "/1.0/instances/c1", Status: 403, Message: "Forbidden"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			f.mux.HandleFunc("GET /1.0/instances/c1", tt.handler)
			_, _, err := f.client.GetInstance(testCtx(t), "c1")
			var got *Error
			if !errors.As(err, &got) {
				t.Fatalf("got %T %v, want *Error", err, err)
			}
			if diff := cmp.Diff(tt.want, *got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if IsNotFound(err) != (tt.want.Status == 404) {
				t.Errorf("IsNotFound = %v", IsNotFound(err))
			}
			if !strings.Contains(err.Error(), "GET /1.0/instances/c1") {
				t.Errorf("message does not name the request: %v", err)
			}
		})
	}
}

func TestConnectionError(t *testing.T) {
	t.Parallel()
	c := New(filepath.Join(t.TempDir(), "nothing.socket"))
	_, err := c.Server(testCtx(t))
	if err == nil || !strings.Contains(err.Error(), "nothing.socket") {
		t.Errorf("got %v, want an error naming the socket", err)
	}
}

// TestETagRoundTrip: GET returns the ETag, PUT sends it as If-Match, a
// stale one is refused with 412.
func TestETagRoundTrip(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	etag := `"e1"`
	config := map[string]string{"limits.memory": "1GiB"}
	f.mux.HandleFunc("GET /1.0/instances/c1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", etag)
		writeSync(w, map[string]any{
			"name": "c1", "status": "Running", "status_code": 103, "config": config,
			"devices": map[string]any{"gpu": map[string]string{"type": "gpu"}}, "profiles": []string{"default"},
			"expanded_config": map[string]string{"volatile.uuid": "x"},
		})
	})
	f.mux.HandleFunc("PUT /1.0/instances/c1", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-Match") != etag {
			writeError(w, http.StatusPreconditionFailed, "ETag doesn't match")
			return
		}
		var put InstancePut
		if err := json.NewDecoder(r.Body).Decode(&put); err != nil {
			writeError(w, 400, err.Error())
			return
		}
		config = put.Config
		etag = `"e2"`
		writeAsync(w, "op1", nil)
	})
	f.finishOp("op1", nil)

	ctx := testCtx(t)
	inst, tag, err := f.client.GetInstance(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if tag != `"e1"` || !inst.Running() || inst.Devices["gpu"]["type"] != "gpu" || inst.ExpandedConfig["volatile.uuid"] != "x" {
		t.Fatalf("got %+v etag %q", inst, tag)
	}
	put := inst.InstancePut
	put.Config["limits.memory"] = "2GiB"
	if err := f.client.UpdateInstance(ctx, "c1", put, tag); err != nil {
		t.Fatal(err)
	}
	if config["limits.memory"] != "2GiB" {
		t.Errorf("server config after PUT: %v", config)
	}
	err = f.client.UpdateInstance(ctx, "c1", put, tag) // tag is stale now
	if !HasStatus(err, http.StatusPreconditionFailed) {
		t.Fatalf("stale ETag: got %v, want 412", err)
	}
	var ie *Error
	if errors.As(err, &ie); ie.Method != "PUT" || ie.Path != "/1.0/instances/c1" || ie.Message != "ETag doesn't match" {
		t.Errorf("stale ETag error: %+v", ie)
	}
}

func TestCreateInstance(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var body map[string]any
	f.mux.HandleFunc("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&body)
		writeAsync(w, "create1", nil)
	})
	f.finishOp("create1", nil)
	err := f.client.CreateInstance(testCtx(t), InstancesPost{
		Name:        "c1",
		Source:      InstanceSource{Alias: "ubuntu-24.04"},
		InstancePut: InstancePut{Profiles: []string{"default"}, Config: map[string]string{"limits.memory": "96GiB"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"name": "c1", "source": map[string]any{"type": "image", "alias": "ubuntu-24.04"},
		"profiles": []any{"default"}, "config": map[string]any{"limits.memory": "96GiB"},
		"devices": nil, "ephemeral": false, "stateful": false, "description": "",
	}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("POST body (-want +got):\n%s", diff)
	}
	if err := f.client.CreateInstance(testCtx(t), InstancesPost{Name: "c2"}); err == nil {
		t.Error("create without an image accepted")
	}
}

// TestWaitOperation covers the shapes the wait endpoint answers with.
func TestWaitOperation(t *testing.T) {
	t.Parallel()
	type step func(w http.ResponseWriter)
	running := func(w http.ResponseWriter) { writeSync(w, opJSON("op", 103, "", nil)) }
	tests := []struct {
		name      string
		waits     []step                      // answers to successive waits (last repeats)
		get       func(w http.ResponseWriter) // GET /1.0/operations/op
		check     func(t *testing.T, op *Operation, err error)
		ctxTimout time.Duration
	}{
		{
			name: "running then success",
			waits: []step{running, func(w http.ResponseWriter) {
				writeSync(w, opJSON("op", 200, "", map[string]any{"k": "v"}))
			}},
			check: func(t *testing.T, op *Operation, err error) {
				if err != nil || op.Metadata["k"] != "v" {
					t.Errorf("got %+v, %v", op, err)
				}
			},
		},
		{
			name: "HTTP 200 with a failed operation",
			waits: []step{func(w http.ResponseWriter) {
				writeSync(w, opJSON("op", 400, "Failed to start: no such device", nil))
			}},
			check: func(t *testing.T, op *Operation, err error) {
				var oe *OperationError
				if !errors.As(err, &oe) || oe.Err != "Failed to start: no such device" || oe.StatusCode != 400 {
					t.Errorf("got %v, want *OperationError", err)
				}
				var ie *Error
				if errors.As(err, &ie) {
					t.Errorf("an operation failure must not look like an HTTP error: %v", ie)
				}
			},
		},
		{
			name: "HTTP 200 with an error envelope (Incus 6.0), operation failed",
			waits: []step{func(w http.ResponseWriter) {
				writeJSON(w, 200, map[string]any{"type": "error", "error": "Command not found", "error_code": 400})
			}},
			get: func(w http.ResponseWriter) {
				writeSync(w, opJSON("op", 400, "Command not found", map[string]any{"return": 127}))
			},
			check: func(t *testing.T, op *Operation, err error) {
				var oe *OperationError
				if !errors.As(err, &oe) || oe.Err != "Command not found" {
					t.Errorf("got %v, want *OperationError", err)
				}
				if op == nil || op.Metadata["return"] != float64(127) {
					t.Errorf("operation metadata lost: %+v", op)
				}
			},
		},
		{
			name: "HTTP 200 with an error envelope (Incus 6.0), wait timed out, then success",
			waits: []step{func(w http.ResponseWriter) {
				writeJSON(w, 200, map[string]any{"type": "error", "error": "context deadline exceeded", "error_code": 500})
			}, func(w http.ResponseWriter) {
				writeSync(w, opJSON("op", 200, "", nil))
			}},
			get: running,
			check: func(t *testing.T, op *Operation, err error) {
				if err != nil || op.StatusCode != 200 {
					t.Errorf("got %+v, %v", op, err)
				}
			},
		},
		{
			name:  "gone",
			waits: []step{func(w http.ResponseWriter) { writeError(w, 404, "Operation not found") }},
			check: func(t *testing.T, op *Operation, err error) {
				if !errors.Is(err, ErrOperationGone) {
					t.Errorf("got %v, want ErrOperationGone", err)
				}
			},
		},
		{
			name:      "deadline",
			waits:     []step{running},
			ctxTimout: 300 * time.Millisecond,
			check: func(t *testing.T, op *Operation, err error) {
				if !errors.Is(err, context.DeadlineExceeded) || op == nil || op.Status != "Running" {
					t.Errorf("got %+v, %v; want the running operation and DeadlineExceeded", op, err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			var n atomic.Int32
			f.mux.HandleFunc("GET /1.0/operations/op/wait", func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("timeout") == "" {
					t.Error("wait without timeout")
				}
				i := min(int(n.Add(1))-1, len(tt.waits)-1)
				tt.waits[i](w)
			})
			if tt.get != nil {
				f.mux.HandleFunc("GET /1.0/operations/op", func(w http.ResponseWriter, r *http.Request) { tt.get(w) })
			}
			ctx := testCtx(t)
			if tt.ctxTimout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctxTimout)
				defer cancel()
			}
			op, err := f.client.WaitOperation(ctx, "op")
			tt.check(t, op, err)
		})
	}
}

func TestOperationTimeoutCapsWait(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.mux.HandleFunc("GET /1.0/operations/op/wait", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, opJSON("op", 103, "", nil))
	})
	start := time.Now()
	_, err := f.client.WithOperationTimeout(200*time.Millisecond).WaitOperation(context.Background(), "op")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("got %v after %s", err, time.Since(start))
	}
}

func TestStateChanges(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var bodies []stateChange
	f.mux.HandleFunc("PUT /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
		var sc stateChange
		_ = json.NewDecoder(r.Body).Decode(&sc)
		bodies = append(bodies, sc)
		writeAsync(w, "st", nil)
	})
	f.finishOp("st", nil)
	ctx := testCtx(t)
	if err := f.client.Stop(ctx, "c1", 0); err == nil {
		t.Error("Stop with zero timeout accepted")
	}
	if err := f.client.Restart(ctx, "c1", -time.Second); err == nil {
		t.Error("Restart with negative timeout accepted")
	}
	for _, call := range []func() error{
		func() error { return f.client.Start(ctx, "c1") },
		func() error { return f.client.Stop(ctx, "c1", 1500*time.Millisecond) },
		func() error { return f.client.Kill(ctx, "c1") },
		func() error { return f.client.Restart(ctx, "c1", 90*time.Second) },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	want := []stateChange{
		{Action: "start"},
		{Action: "stop", Timeout: 2}, // rounded up
		{Action: "stop", Force: true},
		{Action: "restart", Timeout: 90},
	}
	if diff := cmp.Diff(want, bodies); diff != "" {
		t.Errorf("state bodies (-want +got):\n%s", diff)
	}
}

// TestStateChangeOperationGone: when the operation vanished before the wait,
// the instance's observed state decides.
func TestStateChangeOperationGone(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status  int
		wantErr bool
	}{{102, false}, {103, true}} {
		f := newFake(t)
		f.mux.HandleFunc("PUT /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) { writeAsync(w, "gone", nil) })
		f.mux.HandleFunc("GET /1.0/operations/gone/wait", func(w http.ResponseWriter, r *http.Request) { writeError(w, 404, "not found") })
		f.mux.HandleFunc("GET /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
			writeSync(w, map[string]any{"status_code": tt.status})
		})
		err := f.client.Kill(testCtx(t), "c1")
		if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrOperationGone)) {
			t.Errorf("observed status %d: got %v", tt.status, err)
		}
	}
}

func TestInstanceState(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.mux.HandleFunc("GET /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, map[string]any{
			"status": "Running", "status_code": 103, "pid": 4242, "processes": 7,
			"network": map[string]any{"eth0": map[string]any{
				"addresses": []any{map[string]any{"family": "inet", "address": "10.0.0.5", "netmask": "24", "scope": "global"}},
				"hwaddr":    "00:16:3e:00:00:01", "state": "up", "type": "broadcast", "mtu": 1500,
			}},
		})
	})
	st, err := f.client.InstanceState(testCtx(t), "c1")
	if err != nil {
		t.Fatal(err)
	}
	want := &InstanceState{Status: "Running", StatusCode: 103, Pid: 4242, Processes: 7, Network: map[string]NetworkState{
		"eth0": {Addresses: []NetworkAddress{{Family: "inet", Address: "10.0.0.5", Netmask: "24", Scope: "global"}},
			Hwaddr: "00:16:3e:00:00:01", State: "up", Type: "broadcast", MTU: 1500},
	}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}

func TestExec(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var got execPost
	deleted := map[string]bool{}
	f.mux.HandleFunc("POST /1.0/instances/c1/exec", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		writeAsync(w, "ex", map[string]any{})
	})
	f.finishOp("ex", map[string]any{
		"return": 3,
		"output": map[string]any{
			"1": "/1.0/instances/c1/logs/exec-output/exec_1.stdout",
			"2": "/1.0/instances/c1/logs/exec-output/exec_1.stderr",
		},
	})
	f.mux.HandleFunc("GET /1.0/instances/c1/logs/exec-output/{file}", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "content of "+r.PathValue("file"))
	})
	f.mux.HandleFunc("DELETE /1.0/instances/c1/logs/exec-output/{file}", func(w http.ResponseWriter, r *http.Request) {
		deleted[r.PathValue("file")] = true
		writeSync(w, map[string]any{})
	})
	res, err := f.client.Exec(testCtx(t), "c1", ExecRequest{
		Command: []string{"nvidia-smi", "-q"}, Env: map[string]string{"A": "1"}, Cwd: "/tmp", User: 1000, Group: 1001,
	})
	if err != nil {
		t.Fatal(err)
	}
	wantReq := execPost{
		Command: []string{"nvidia-smi", "-q"}, Environment: map[string]string{"A": "1"}, Cwd: "/tmp",
		User: 1000, Group: 1001, RecordOutput: true, WaitForWS: false, Interactive: false,
	}
	if diff := cmp.Diff(wantReq, got); diff != "" {
		t.Errorf("exec body (-want +got):\n%s", diff)
	}
	wantRes := &ExecResult{ExitCode: 3, Stdout: []byte("content of exec_1.stdout"), Stderr: []byte("content of exec_1.stderr")}
	if diff := cmp.Diff(wantRes, res); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	if !deleted["exec_1.stdout"] || !deleted["exec_1.stderr"] {
		t.Errorf("logs not deleted: %v", deleted)
	}
}

func TestExecFailures(t *testing.T) {
	t.Parallel()
	t.Run("empty command", func(t *testing.T) {
		if _, err := New("/nonexistent").Exec(testCtx(t), "c1", ExecRequest{}); err == nil {
			t.Error("empty command accepted")
		}
	})
	t.Run("instance not running", func(t *testing.T) {
		f := newFake(t)
		f.mux.HandleFunc("POST /1.0/instances/c1/exec", func(w http.ResponseWriter, r *http.Request) {
			writeError(w, 400, "Instance is not running")
		})
		_, err := f.client.Exec(testCtx(t), "c1", ExecRequest{Command: []string{"true"}})
		if !HasStatus(err, 400) || !strings.Contains(err.Error(), "Instance is not running") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("operation gone: exit code lost", func(t *testing.T) {
		f := newFake(t)
		f.mux.HandleFunc("POST /1.0/instances/c1/exec", func(w http.ResponseWriter, r *http.Request) { writeAsync(w, "ex", nil) })
		f.mux.HandleFunc("GET /1.0/operations/ex/wait", func(w http.ResponseWriter, r *http.Request) { writeError(w, 404, "not found") })
		res, err := f.client.Exec(testCtx(t), "c1", ExecRequest{Command: []string{"true"}})
		if res != nil || !errors.Is(err, ErrOperationGone) {
			t.Errorf("got %+v, %v", res, err)
		}
	})
	t.Run("log cleanup fails", func(t *testing.T) {
		f := newFake(t)
		f.mux.HandleFunc("POST /1.0/instances/c1/exec", func(w http.ResponseWriter, r *http.Request) { writeAsync(w, "ex", nil) })
		f.finishOp("ex", map[string]any{"return": 0, "output": map[string]any{
			"1": "/1.0/instances/c1/logs/o", "2": "/1.0/instances/c1/logs/e",
		}})
		f.mux.HandleFunc("GET /1.0/instances/c1/logs/{f}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") })
		f.mux.HandleFunc("DELETE /1.0/instances/c1/logs/{f}", func(w http.ResponseWriter, r *http.Request) { writeError(w, 500, "disk on fire") })
		res, err := f.client.Exec(testCtx(t), "c1", ExecRequest{Command: []string{"true"}})
		if res == nil || string(res.Stdout) != "x" || err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Errorf("got %+v, %v; want the result and the cleanup error", res, err)
		}
	})
}

func TestFiles(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var pushed struct {
		path, body string
		hdr        http.Header
	}
	f.mux.HandleFunc("POST /1.0/instances/c1/files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		pushed.path, pushed.body, pushed.hdr = r.URL.Query().Get("path"), string(b), r.Header
		writeSync(w, map[string]any{})
	})
	f.mux.HandleFunc("GET /1.0/instances/c1/files", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("path") {
		case "/etc/motd":
			w.Header().Set("X-Incus-Uid", "1000")
			w.Header().Set("X-Incus-Gid", "1001")
			w.Header().Set("X-Incus-Mode", "0640")
			w.Header().Set("X-Incus-Type", "file")
			io.WriteString(w, "hello")
		case "/etc":
			w.Header().Set("X-Incus-Type", "directory")
			writeSync(w, []string{"motd"})
		default:
			writeError(w, 404, "not found")
		}
	})
	ctx := testCtx(t)
	err := f.client.PushFile(ctx, "c1", "/etc/my file", strings.NewReader("data"), FileInfo{UID: 1000, GID: 1001, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	if pushed.path != "/etc/my file" || pushed.body != "data" {
		t.Errorf("pushed %q %q", pushed.path, pushed.body)
	}
	for k, want := range map[string]string{"X-Incus-Uid": "1000", "X-Incus-Gid": "1001", "X-Incus-Mode": "0755", "X-Incus-Type": "file", "X-Incus-Write": "overwrite", "Content-Type": "application/octet-stream"} {
		if got := pushed.hdr.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	data, info, err := f.client.PullFile(ctx, "c1", "/etc/motd")
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != "hello" || info != (FileInfo{UID: 1000, GID: 1001, Mode: 0o640, Type: "file"}) {
		t.Errorf("pulled %q %+v", data, info)
	}
	if _, _, err := f.client.PullFile(ctx, "c1", "/etc"); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("pull of a directory: %v", err)
	}
	if _, _, err := f.client.PullFile(ctx, "c1", "/missing"); !IsNotFound(err) {
		t.Errorf("pull of a missing file: %v", err)
	}
}

func TestImportImage(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var got struct {
		ctype, aliases string
		parts          map[string]string
		body           string
	}
	f.mux.HandleFunc("POST /1.0/images", func(w http.ResponseWriter, r *http.Request) {
		got.ctype, got.aliases = r.Header.Get("Content-Type"), r.Header.Get("X-Incus-Aliases")
		got.parts = map[string]string{}
		if mt, params, _ := mime.ParseMediaType(got.ctype); mt == "multipart/form-data" {
			mr := multipart.NewReader(r.Body, params["boundary"])
			for {
				p, err := mr.NextPart()
				if err != nil {
					break
				}
				b, _ := io.ReadAll(p)
				got.parts[p.FormName()] = string(b)
			}
		} else {
			b, _ := io.ReadAll(r.Body)
			got.body = string(b)
		}
		writeAsync(w, "img", nil)
	})
	f.finishOp("img", map[string]any{"fingerprint": "abc123", "size": 42})
	ctx := testCtx(t)

	fp, err := f.client.ImportImage(ctx, strings.NewReader("unified tarball"), nil, "busybox", "bb")
	if err != nil {
		t.Fatal(err)
	}
	if fp != "abc123" || got.body != "unified tarball" || got.ctype != "application/octet-stream" || got.aliases != "alias=busybox&alias=bb" {
		t.Errorf("unified: fp %q, sent %+v", fp, got)
	}

	if _, err := f.client.ImportImage(ctx, strings.NewReader("meta"), strings.NewReader("root"), "split"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"metadata": "meta", "rootfs": "root"}, got.parts); diff != "" {
		t.Errorf("split parts (-want +got):\n%s", diff)
	}

	f.mux.HandleFunc("GET /1.0/images/aliases/busybox", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, map[string]any{"name": "busybox", "target": "abc123", "type": "container"})
	})
	f.mux.HandleFunc("GET /1.0/images/abc123", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, map[string]any{"fingerprint": "abc123", "architecture": "x86_64", "properties": map[string]string{"os": "busybox"}})
	})
	a, err := f.client.GetImageAlias(ctx, "busybox")
	if err != nil || a.Target != "abc123" {
		t.Fatalf("alias %+v %v", a, err)
	}
	img, err := f.client.GetImage(ctx, a.Target)
	if err != nil || img.Properties["os"] != "busybox" {
		t.Fatalf("image %+v %v", img, err)
	}
}

func TestDeleteAndPatch(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var patch map[string]any
	f.mux.HandleFunc("PATCH /1.0/instances/c1", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-Match") != `"e"` {
			writeError(w, 412, "ETag doesn't match")
			return
		}
		_ = json.NewDecoder(r.Body).Decode(&patch)
		writeSync(w, map[string]any{}) // PATCH may answer synchronously
	})
	f.mux.HandleFunc("DELETE /1.0/instances/c1", func(w http.ResponseWriter, r *http.Request) { writeAsync(w, "del", nil) })
	f.finishOp("del", nil)
	ctx := testCtx(t)
	if err := f.client.PatchInstance(ctx, "c1", InstancePatch{Config: map[string]string{"a": "b"}}, `"e"`); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]any{"config": map[string]any{"a": "b"}}, patch); diff != "" {
		t.Errorf("patch body (-want +got):\n%s", diff)
	}
	if err := f.client.PatchInstance(ctx, "c1", InstancePatch{}, `"old"`); !HasStatus(err, 412) {
		t.Errorf("stale patch: %v", err)
	}
	if err := f.client.DeleteInstance(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	calls := f.Calls()
	if len(calls) != 4 || calls[2] != "DELETE /1.0/instances/c1" || !strings.HasPrefix(calls[3], "GET /1.0/operations/del/wait?timeout=") {
		t.Errorf("calls: %q", calls)
	}
}

func TestQuery(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	f.mux.HandleFunc("GET /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, []string{"/1.0/instances/a", "/1.0/instances/b"})
	})
	f.mux.HandleFunc("POST /1.0/storage-pools", func(w http.ResponseWriter, r *http.Request) { writeAsync(w, "pool", nil) })
	f.finishOp("pool", map[string]any{"x": 1})
	ctx := testCtx(t)
	var urls []string
	if err := f.client.Query(ctx, "GET", "/1.0/instances", nil, &urls); err != nil || len(urls) != 2 {
		t.Errorf("sync query: %v %v", urls, err)
	}
	var op Operation
	if err := f.client.Query(ctx, "POST", "/1.0/storage-pools", map[string]string{"name": "p"}, &op); err != nil || op.StatusCode != 200 {
		t.Errorf("async query: %+v %v", op, err)
	}
	if err := f.client.Query(ctx, "GET", "relative", nil, nil); err == nil {
		t.Error("relative path accepted")
	}
}

// TestCreateInstanceTarget checks that a cluster member goes into the query
// string, not the body.
func TestCreateInstanceTarget(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var body map[string]any
	f.mux.HandleFunc("POST /1.0/instances", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&body)
		writeAsync(w, "create-t", nil)
	})
	f.finishOp("create-t", nil)
	err := f.client.CreateInstance(testCtx(t), InstancesPost{Name: "c1", Source: InstanceSource{Alias: "img"}, Target: "member2"})
	if err != nil {
		t.Fatal(err)
	}
	if calls := f.Calls(); len(calls) == 0 || calls[0] != "POST /1.0/instances?target=member2" {
		t.Errorf("calls = %v, want POST /1.0/instances?target=member2 first", calls)
	}
	if _, ok := body["target"]; ok {
		t.Errorf("target leaked into the body: %v", body)
	}
}

// TestStateChangeAlreadyThere: a start that fails because the instance already runs (a
// start left in flight by an agent killed mid-apply) is a success; a restart is not judged
// by the status it ends in.
func TestStateChangeAlreadyThere(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		call    func(*Client) error
		status  int
		wantErr bool
	}{
		{"start of a running instance", func(c *Client) error { return c.Start(testCtx(t), "c1") }, 103, false},
		{"start that failed and left it stopped", func(c *Client) error { return c.Start(testCtx(t), "c1") }, 102, true},
		{"stop of a stopped instance", func(c *Client) error { return c.Stop(testCtx(t), "c1", time.Second) }, 102, false},
		{"restart that failed", func(c *Client) error { return c.Restart(testCtx(t), "c1", time.Second) }, 103, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFake(t)
			f.mux.HandleFunc("PUT /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
				writeError(w, 400, "The instance is already running")
			})
			f.mux.HandleFunc("GET /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
				writeSync(w, map[string]any{"status_code": tt.status})
			})
			if err := tt.call(f.client); (err != nil) != tt.wantErr {
				t.Errorf("err = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

// TestInstanceStateRetriesServerErrors: Incus 6.0 answers a state read with a transient
// 500 ("Invalid PID") while an instance stops; the read is retried, a 404 is not.
func TestInstanceStateRetriesServerErrors(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var calls atomic.Int32
	f.mux.HandleFunc("GET /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			writeError(w, 500, "Invalid PID '\ufffd'")
			return
		}
		writeSync(w, map[string]any{"status": "Stopped", "status_code": 102})
	})
	st, err := f.client.InstanceState(testCtx(t), "c1")
	if err != nil || st.StatusCode != 102 || calls.Load() != 3 {
		t.Fatalf("state = %+v, %v after %d calls", st, err, calls.Load())
	}
	// A stop that takes seconds answers 500 all along (a loaded machine's 5 s shutdown):
	// the read outlasts it.
	stopEnds := time.Now().Add(2500 * time.Millisecond)
	f.mux.HandleFunc("GET /1.0/instances/c3/state", func(w http.ResponseWriter, r *http.Request) {
		if time.Now().Before(stopEnds) {
			writeError(w, 500, "Invalid PID '\ufffd'")
			return
		}
		writeSync(w, map[string]any{"status": "Stopped", "status_code": 102})
	})
	if st, err := f.client.InstanceState(testCtx(t), "c3"); err != nil || st.StatusCode != 102 {
		t.Fatalf("a 2.5 s stop: state = %+v, %v", st, err)
	}
	var gone atomic.Int32
	f.mux.HandleFunc("GET /1.0/instances/c2/state", func(w http.ResponseWriter, r *http.Request) {
		gone.Add(1)
		writeError(w, 404, "Instance not found")
	})
	if _, err := f.client.InstanceState(testCtx(t), "c2"); !IsNotFound(err) || gone.Load() != 1 {
		t.Errorf("404: %v after %d calls, want one call", err, gone.Load())
	}
}

// TestBusyInstanceIsWaitedFor: a state change refused because the instance runs another
// operation is retried until it is accepted (within the context).
func TestBusyInstanceIsWaitedFor(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var calls atomic.Int32
	f.mux.HandleFunc("PUT /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) < 3 {
			writeError(w, 400, `Failed to create instance start operation: Instance is busy running a "create" operation`)
			return
		}
		writeAsync(w, "st", nil)
	})
	f.finishOp("st", nil)
	if err := f.client.Start(testCtx(t), "c1"); err != nil || calls.Load() != 3 {
		t.Fatalf("Start = %v after %d calls", err, calls.Load())
	}
}

// TestBusyOperationIsWaitedFor: Incus may accept the state change and fail the operation
// because the instance is busy; the change is tried again once the other one ends.
func TestBusyOperationIsWaitedFor(t *testing.T) {
	t.Parallel()
	f := newFake(t)
	var calls atomic.Int32
	f.mux.HandleFunc("PUT /1.0/instances/c1/state", func(w http.ResponseWriter, r *http.Request) {
		writeAsync(w, fmt.Sprintf("st%d", calls.Add(1)), nil)
	})
	f.mux.HandleFunc("GET /1.0/operations/st1/wait", func(w http.ResponseWriter, r *http.Request) {
		writeSync(w, opJSON("st1", 400, `Failed to create instance start operation: Instance is busy running a "create" operation`, nil))
	})
	f.finishOp("st2", nil)
	if err := f.client.Start(testCtx(t), "c1"); err != nil || calls.Load() != 2 {
		t.Fatalf("Start = %v after %d calls", err, calls.Load())
	}
}
