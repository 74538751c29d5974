package resources

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/resources/restest"
)

// TestCheckWritesNothing (issue 24): every kind's Check runs against a state store that
// fails on any write (its record read-only, as the engine gives it to every Check: a
// write is state.ErrReadOnly, and so an error of the Check), and the whole state
// directory is compared before and after, so that no write around the store goes
// unseen either. The server and the download run in the states where an observation
// used to write its record: what it found comes back as data (Diff.Record).
func TestCheckWritesNothing(t *testing.T) {
	t.Parallel()
	t.Run("file", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		store := restest.OpenStore(t, filepath.Join(dir, ".state"))
		src := "variable \"root\" {}\nfile \"f\" {\n  path    = \"${var.root}/f.conf\"\n  content = \"x\\n\"\n}\n"
		if d := checkWritesNothing(t, dir, src, Kinds(), store, "file.f", "root="+dir); d.Action != agent.Create {
			t.Errorf("diff %+v, want a create", d)
		}
	})
	t.Run("nvidia_driver", func(t *testing.T) {
		t.Parallel()
		root := fakeRoot(t, tree570)
		h := Machine{Root: root, GPU: gpu.ProcFS{Root: root}, Run: &fakeRunner{}}
		dir := t.TempDir()
		store := restest.OpenStore(t, filepath.Join(dir, ".state"))
		if d := checkWritesNothing(t, dir, `nvidia_driver "host" { version = "570.172.08" }`, KindsFor(h), store, "nvidia_driver.host"); d.Action != agent.NoOp {
			t.Errorf("diff %+v, want a no-op", d)
		}
	})
	t.Run("download listing", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		hub := newFakeHub(t, hubFiles())
		tokenFile := filepath.Join(dir, "hf-token")
		os.WriteFile(tokenFile, []byte(hub.token+"\n"), 0o600)
		store := restest.OpenStore(t, filepath.Join(dir, ".state"))
		d := checkWritesNothing(t, dir, hubPlan(hub, tokenFile, "main"), Kinds(), store, "download.model", "root="+dir)
		if rec, ok := recordOf[*downloadRecord](d); d.Record == nil || !ok || rec.Hub == nil || rec.Hub.Commit == "" {
			t.Errorf("the listing is not in the diff as a record update: %+v", d.Record)
		}
	})
	t.Run("server adopted", func(t *testing.T) {
		t.Parallel()
		h := newSrvHarness(t)
		mustOK(t, h.apply())
		launched := h.record()
		h.kill()
		if err := h.store.Delete("server.qwen"); err != nil {
			t.Fatal(err)
		}
		own := exec.Command(launched.Argv[0], launched.Argv[1:]...)
		own.Env = []string{"FAKE_SGLANG=", "FAKE_SGLANG_DECODE_INTERVAL=100ms"}
		own.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := own.Start(); err != nil {
			t.Fatal(err)
		}
		go own.Wait()
		t.Cleanup(func() { _ = syscall.Kill(-own.Process.Pid, syscall.SIGKILL) })
		oid := waitPortOwner(t, h.port)
		d := h.checkWritesNothing()
		if rec, ok := recordOf[*serverRecord](d); d.Action != agent.Adopt || !ok || rec.id() != oid || !rec.Adopted {
			t.Errorf("diff %+v (record %+v), want the adoption of %v", d, d.Record, oid)
		}
	})
	t.Run("server not ready", func(t *testing.T) {
		t.Parallel()
		h := newSrvHarness(t)
		mustOK(t, h.apply())
		first := h.record()
		if err := syscall.Kill(first.PID, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(first.PID, syscall.SIGCONT) })
		// The frozen process may answer a probe already under way: looked at until its
		// probe fails, as an agent would at its next observation.
		deadline := time.Now().Add(30 * time.Second)
		for {
			d := h.checkWritesNothing()
			if rec, ok := recordOf[*serverRecord](d); d.Record != nil && ok && !rec.UnreadySince.IsZero() && rec.id() == first.id() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("never found not ready as data: %+v", d)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("server pending launch", func(t *testing.T) {
		t.Parallel()
		h := newSrvHarness(t)
		mustOK(t, h.apply())
		h.kill()
		held := h.record()
		intent := held
		intent.Generation, intent.PID, intent.Marker = held.Generation+1, 0, "AGENT_SERVER=server.qwen#2@42"
		held.Pending = &intent
		if err := h.store.Save("server.qwen", &held); err != nil {
			t.Fatal(err)
		}
		d := h.checkWritesNothing()
		if rec, ok := recordOf[*serverRecord](d); d.Record == nil || !ok || rec.Pending != nil || rec.Generation != held.Generation {
			t.Errorf("the void intent is not dropped as data: %+v", d.Record)
		}
	})
	t.Run("container", func(t *testing.T) {
		t.Parallel()
		h := newCtrHarness(t)
		src := fmt.Sprintf("variable \"incus_socket\" {}\nagent { incus_socket = var.incus_socket }\ncontainer \"c\" {\n  name = %q\n  image = \"busybox\"\n}\n", h.name)
		if d := checkWritesNothing(t, h.dir, src, KindsFor(Machine{GPU: a6000}), h.store, "container.c", "incus_socket="+h.d.Socket); d.Action != agent.Create {
			t.Errorf("diff %+v, want a create", d)
		}
	})
}

// checkWritesNothing is the server harness's plan as one Check against a failing store.
func (h *srvHarness) checkWritesNothing() *agent.Diff {
	h.t.Helper()
	vars := []string{"fake=" + fakeSGLang(h.t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}
	return checkWritesNothing(h.t, h.dir, srvPlan, KindsFor(Machine{}), h.store, "server.qwen", vars...)
}

// checkWritesNothing binds src and runs addr's Check with its record read-only, failing
// the test on an error of the Check (a write is one) or on any change under the state
// directory.
func checkWritesNothing(t *testing.T, dir, src string, kinds []agent.Kind, store *state.Store, addr string, vars ...string) *agent.Diff {
	t.Helper()
	p := restest.LoadPlan(t, dir, src, kinds, vars...)
	res, diags := agent.Bind(p, kinds)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	before := stateFiles(t, store.Dir())
	env := &agent.Env{Addr: addr, State: store.For(addr).ReadOnly(), Log: discardLog(), Plan: p, Now: time.Now}
	d, err := res[addr].Check(t.Context(), env)
	if err != nil {
		t.Fatalf("%s: check: %v", addr, err)
	}
	if after := stateFiles(t, store.Dir()); !maps.Equal(before, after) {
		t.Errorf("%s: its check changed the state directory:\nbefore %v\nafter  %v", addr, before, after)
	}
	return d
}

// stateFiles is every file under dir with its mode, time and content digest.
func stateFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		sum := ""
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum = fmt.Sprintf("%x", sha256.Sum256(data))
		}
		out[strings.TrimPrefix(p, dir)] = fmt.Sprintf("%v %d %s", info.Mode(), info.ModTime().UnixNano(), sum)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordOf is d's record update as T; false when d has none, or another.
func recordOf[T any](d *agent.Diff) (T, bool) {
	var zero T
	if d == nil || d.Record == nil {
		return zero, false
	}
	v, ok := d.Record.Value.(T)
	return v, ok
}
