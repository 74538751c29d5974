package server

import (
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/resources"
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
		if rec, ok := restest.RecordOf[*serverRecord](d); d.Action != agent.Adopt || !ok || rec.id() != oid || !rec.Adopted {
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
			if rec, ok := restest.RecordOf[*serverRecord](d); d.Record != nil && ok && !rec.UnreadySince.IsZero() && rec.id() == first.id() {
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
		if rec, ok := restest.RecordOf[*serverRecord](d); d.Record == nil || !ok || rec.Pending != nil || rec.Generation != held.Generation {
			t.Errorf("the void intent is not dropped as data: %+v", d.Record)
		}
	})
}

// checkWritesNothing is the server harness's plan as one Check against a failing store.
func (h *srvHarness) checkWritesNothing() *agent.Diff {
	h.t.Helper()
	vars := []string{"fake=" + fakeSGLang(h.t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}
	return restest.CheckWritesNothing(h.t, h.dir, srvPlan, kindsFor(resources.Machine{}), h.store, "server.qwen", vars...)
}
