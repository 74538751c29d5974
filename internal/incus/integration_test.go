package incus_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
)

// incusd is this test binary's private Incus daemon, started by the first
// test that needs it.
var incusd = incustest.NewShared()

// cluster is this test binary's private three-member cluster, formed by the first
// cluster test.
var cluster = incustest.NewSharedCluster()

func TestMain(m *testing.M) { os.Exit(cluster.Done(incusd.Run(m))) }

// launch creates and starts a busybox instance for the test.
func launch(t *testing.T, ctx context.Context, d *incustest.Daemon) string {
	t.Helper()
	name := d.InstanceName(t)
	err := d.Client.CreateInstance(ctx, incus.InstancesPost{
		Name:        name,
		Source:      incus.InstanceSource{Alias: d.Image},
		InstancePut: incus.InstancePut{Profiles: []string{"default"}, Config: map[string]string{"user.test": "1"}},
	})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, d.LogTail(20))
	}
	if err := d.Client.Start(ctx, name); err != nil {
		t.Fatalf("start: %v\n%s", err, d.LogTail(20))
	}
	return name
}

func TestIntegrationServer(t *testing.T) {
	d := incusd.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := d.Client.Server(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.APIVersion != "1.0" || s.Auth != "trusted" || s.Environment.Driver == "" {
		t.Errorf("server: api %q auth %q driver %q", s.APIVersion, s.Auth, s.Environment.Driver)
	}
	if !s.HasExtension("container_exec_recording") {
		t.Error("server lacks container_exec_recording")
	}
	img, err := d.Client.GetImage(ctx, d.ImageFingerprint)
	if err != nil {
		t.Fatal(err)
	}
	alias, err := d.Client.GetImageAlias(ctx, d.Image)
	if err != nil {
		t.Fatal(err)
	}
	if alias.Target != img.Fingerprint || img.Properties["os"] != "busybox" {
		t.Errorf("alias %+v, image %s properties %v", alias, img.Fingerprint, img.Properties)
	}
	if _, err := d.Client.GetImageAlias(ctx, "no-such-alias"); !incus.IsNotFound(err) {
		t.Errorf("missing alias: got %v, want a 404 *incus.Error", err)
	}
}

// TestIntegrationLifecycle walks one instance through create, start, exec,
// files, config updates, stop and delete against the real daemon.
func TestIntegrationLifecycle(t *testing.T) {
	d := incusd.Start(t)
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name := launch(t, ctx, d)

	st, err := c.InstanceState(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.StatusCode != incus.StatusRunning || st.Pid <= 0 {
		t.Fatalf("state after start: %s (code %d), pid %d", st.Status, st.StatusCode, st.Pid)
	}
	if _, err := os.Stat("/proc/" + itoa(st.Pid)); err != nil {
		t.Errorf("init pid %d not visible on the host: %v", st.Pid, err)
	}

	t.Run("exec", func(t *testing.T) {
		res, err := c.Exec(ctx, name, incus.ExecRequest{Command: []string{"echo", "hi"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || string(res.Stdout) != "hi\n" || len(res.Stderr) != 0 {
			t.Errorf("echo hi: code %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("exec env cwd stderr exit code", func(t *testing.T) {
		res, err := c.Exec(ctx, name, incus.ExecRequest{
			Command: []string{"sh", "-c", `echo "$GREETING $(pwd)"; echo oops >&2; exit 3`},
			Env:     map[string]string{"GREETING": "hello"},
			Cwd:     "/tmp",
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 3 || string(res.Stdout) != "hello /tmp\n" || string(res.Stderr) != "oops\n" {
			t.Errorf("got code %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
	t.Run("exec as user", func(t *testing.T) {
		res, err := c.Exec(ctx, name, incus.ExecRequest{Command: []string{"id", "-u"}, User: 65534, Group: 65534})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(res.Stdout)) != "65534" {
			t.Errorf("id -u as 65534: %q (code %d)", res.Stdout, res.ExitCode)
		}
	})
	t.Run("exec failing command", func(t *testing.T) {
		res, err := c.Exec(ctx, name, incus.ExecRequest{Command: []string{"false"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 1 {
			t.Errorf("false: exit code %d, want 1", res.ExitCode)
		}
	})
	t.Run("exec missing command", func(t *testing.T) {
		res, err := c.Exec(ctx, name, incus.ExecRequest{Command: []string{"/no/such/command"}})
		// Incus fails the operation but still reports the shell's 127.
		var opErr *incus.OperationError
		if !errors.As(err, &opErr) || !strings.Contains(opErr.Err, "not found") {
			t.Errorf("missing command: got error %v, want an *incus.OperationError saying not found", err)
		}
		if res == nil || res.ExitCode != 127 {
			t.Errorf("missing command: result %+v, want exit code 127", res)
		}
	})
	t.Run("exec past the deadline", func(t *testing.T) {
		sctx, scancel := context.WithTimeout(ctx, 2500*time.Millisecond)
		defer scancel()
		start := time.Now()
		_, err := c.Exec(sctx, name, incus.ExecRequest{Command: []string{"sleep", "30"}})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want context.DeadlineExceeded", err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("wait overran its deadline: %s", took)
		}
		// Don't leave the sleep running into the other subtests.
		if _, err := c.Exec(ctx, name, incus.ExecRequest{Command: []string{"killall", "sleep"}}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("exec output logs are deleted", func(t *testing.T) {
		var logs []string
		if err := c.Query(ctx, "GET", "/1.0/instances/"+name+"/logs", nil, &logs); err != nil {
			t.Fatal(err)
		}
		for _, l := range logs {
			if strings.Contains(l, "exec") {
				t.Errorf("exec output left behind: %s", l)
			}
		}
	})

	t.Run("files", func(t *testing.T) {
		content := []byte("blacklist nouveau\x00\xff\n")
		err := c.PushFile(ctx, name, "/root/pushed.conf", bytes.NewReader(content), incus.FileInfo{UID: 0, GID: 0, Mode: 0o640})
		if err != nil {
			t.Fatal(err)
		}
		got, info, err := c.PullFile(ctx, name, "/root/pushed.conf")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, content) || info.Mode != 0o640 || info.UID != 0 || info.Type != "file" {
			t.Errorf("pulled %q %+v", got, info)
		}
		// Owner other than root, and the file is visible to processes inside.
		if err := c.PushFile(ctx, name, "/tmp/nobody", strings.NewReader("x"), incus.FileInfo{UID: 65534, GID: 65534, Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
		res, err := c.Exec(ctx, name, incus.ExecRequest{Command: []string{"stat", "-c", "%u:%g %a", "/tmp/nobody"}})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(res.Stdout)) != "65534:65534 600" {
			t.Errorf("stat inside: %q", res.Stdout)
		}
		if _, _, err := c.PullFile(ctx, name, "/no/such/file"); !incus.IsNotFound(err) {
			t.Errorf("pull missing file: got %v, want 404", err)
		}
		// A directory lists its entries; pulled, it says it is one.
		names, err := c.ListFiles(ctx, name, "/root")
		if err != nil || !slices.Contains(names, "pushed.conf") {
			t.Errorf("list /root: %q %v", names, err)
		}
		if _, info, err := c.PullFile(ctx, name, "/root"); err == nil || info.Type != "directory" {
			t.Errorf("pull a directory: %+v %v, want an error and type directory", info, err)
		}
		if _, err := c.ListFiles(ctx, name, "/root/pushed.conf"); err == nil {
			t.Error("a file listed as a directory")
		}
		if _, err := c.ListFiles(ctx, name, "/no/such/dir"); !incus.IsNotFound(err) {
			t.Errorf("list a missing directory: got %v, want 404", err)
		}
	})

	t.Run("config put with etag", func(t *testing.T) {
		inst, etag, err := c.GetInstance(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if etag == "" {
			t.Fatal("no ETag")
		}
		put := inst.InstancePut
		put.Config["user.agent.generation"] = "1"
		if err := c.UpdateInstance(ctx, name, put, etag); err != nil {
			t.Fatal(err)
		}
		// The old ETag is stale now.
		put.Config["user.agent.generation"] = "2"
		err = c.UpdateInstance(ctx, name, put, etag)
		var ie *incus.Error
		if !errors.As(err, &ie) || ie.Status != http.StatusPreconditionFailed {
			t.Fatalf("PUT with stale ETag: got %v, want 412 *incus.Error", err)
		}
		if ie.Method != http.MethodPut || !strings.HasSuffix(ie.Path, "/"+name) {
			t.Errorf("error names request %s %s", ie.Method, ie.Path)
		}
		inst, etag2, err := c.GetInstance(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Config["user.agent.generation"] != "1" || etag2 == etag {
			t.Errorf("after update: generation %q, etag changed %v", inst.Config["user.agent.generation"], etag2 != etag)
		}
		if err := c.PatchInstance(ctx, name, incus.InstancePatch{Config: map[string]string{"user.patched": "yes"}}, etag2); err != nil {
			t.Fatal(err)
		}
		inst, _, err = c.GetInstance(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if inst.Config["user.patched"] != "yes" || inst.Config["user.agent.generation"] != "1" {
			t.Errorf("after patch: %v", inst.Config)
		}
	})

	t.Run("stop and delete", func(t *testing.T) {
		if err := c.Stop(ctx, name, 0); err == nil {
			t.Fatal("Stop with a zero timeout was accepted")
		}
		if err := c.DeleteInstance(ctx, name); err == nil {
			t.Fatal("deleting a running instance succeeded")
		}
		start := time.Now()
		if err := c.Stop(ctx, name, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 15*time.Second {
			t.Errorf("clean stop took %s; init ignored the halt signal?", took)
		}
		st, err := c.InstanceState(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.StatusCode != incus.StatusStopped || st.Pid != 0 {
			t.Errorf("after stop: %s pid %d", st.Status, st.Pid)
		}
		if err := c.DeleteInstance(ctx, name); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.GetInstance(ctx, name); !incus.IsNotFound(err) {
			t.Errorf("after delete: got %v, want 404", err)
		}
	})
}

func TestIntegrationKillAndRestart(t *testing.T) {
	d := incusd.Start(t)
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := launch(t, ctx, d)
	before, err := c.InstanceState(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, name, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	after, err := c.InstanceState(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if after.StatusCode != incus.StatusRunning || after.Pid == before.Pid {
		t.Errorf("restart: %s, pid %d -> %d", after.Status, before.Pid, after.Pid)
	}
	if err := c.Kill(ctx, name); err != nil {
		t.Fatal(err)
	}
	st, err := c.InstanceState(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.StatusCode != incus.StatusStopped {
		t.Errorf("after kill: %s", st.Status)
	}
}

func TestIntegrationCreateErrors(t *testing.T) {
	d := incusd.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := d.InstanceName(t)
	err := d.Client.CreateInstance(ctx, incus.InstancesPost{Name: name, Source: incus.InstanceSource{Alias: "no-such-image"}})
	if err == nil {
		t.Fatal("create from a missing image succeeded")
	}
	t.Logf("create from missing image: %v", err)
	if err := d.Client.Start(ctx, "no-such-instance"); !incus.IsNotFound(err) {
		t.Errorf("start missing instance: got %v, want 404", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestIntegrationStopTimeout proves that a clean stop whose timeout passes
// fails and leaves the instance running, and that Kill then stops it.
func TestIntegrationStopTimeout(t *testing.T) {
	d := incusd.Start(t)
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := d.InstanceName(t)
	if err := c.CreateInstance(ctx, incus.InstancesPost{Name: name, Source: incus.InstanceSource{Alias: d.Image}}); err != nil {
		t.Fatal(err)
	}
	// An init that ignores the halt signal (files can be pushed to a stopped
	// instance).
	stubborn := "#!/bin/sh\ntrap '' PWR TERM\nwhile :; do sleep 3600 & wait $!; done\n"
	if err := c.PushFile(ctx, name, "/sbin/init", strings.NewReader(stubborn), incus.FileInfo{Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	err := c.Stop(ctx, name, time.Second)
	var opErr *incus.OperationError
	if !errors.As(err, &opErr) {
		t.Fatalf("stop of an init that ignores SIGPWR: got %v, want *incus.OperationError", err)
	}
	t.Logf("stop timed out as expected: %v", err)
	st, err := c.InstanceState(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if st.StatusCode != incus.StatusRunning {
		t.Fatalf("after a timed-out stop: %s, want Running", st.Status)
	}
	if err := c.Kill(ctx, name); err != nil {
		t.Fatal(err)
	}
	if st, err = c.InstanceState(ctx, name); err != nil || st.StatusCode != incus.StatusStopped {
		t.Fatalf("after kill: %+v %v", st, err)
	}
}

// A start LXC refuses says why: Incus's "Failed to run: incusd forkstart …: exit status
// 1" comes with the errors of the instance's lxc.log, after a second try.
func TestIntegrationFailedStartQuotesLXC(t *testing.T) {
	d := incusd.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := d.InstanceName(t)
	missing := t.TempDir() + "/missing"
	err := d.Client.CreateInstance(ctx, incus.InstancesPost{
		Name:   name,
		Source: incus.InstanceSource{Alias: d.Image},
		InstancePut: incus.InstancePut{Profiles: []string{"default"}, Config: map[string]string{
			"raw.lxc": "lxc.mount.entry = " + missing + " mnt none bind,create=dir 0 0",
		}},
	})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, d.LogTail(20))
	}
	err = d.Client.Start(ctx, name)
	if err == nil {
		t.Fatal("a start whose mount source is missing succeeded")
	}
	t.Logf("start: %v", err)
	for _, want := range []string{"forkstart", "(tried twice)", "lxc.log errors:", missing} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q", want)
		}
	}
}
