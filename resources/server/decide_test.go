package server

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// TestDecideNeedsNoHost (issue 36): decide is a function of the plan and an observation
// alone. Each case hands it an observation built by hand, for a server whose host has
// no /proc (an empty directory), no GPU and no Incus, and whose PIDs run nowhere: what
// it decides comes from the observation, or a read of the host would fail the case.
func TestDecideNeedsNoHost(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	s := &Server{
		addr: "server.qwen", name: "qwen", place: "host", host: resources.Machine{Proc: proc.FS{Root: t.TempDir()}},
		command: []string{"/opt/sglang/bin/python", "-m", "sglang.launch_server"}, args: []string{"--port", "30000"},
		workdir: defaultWorkdir, port: 30000, grace: time.Minute, stopSignal: syscall.SIGTERM, stopTimeout: time.Second,
		preflightMode: "warn", ready: lifecycle.Ready{Timeout: time.Minute},
	}
	launched := func(gen, pid int) serverRecord {
		r := s.record()
		r.Generation, r.PID, r.StartTicks, r.LaunchedAt, r.VerifiedAt = gen, pid, 1000+uint64(pid), now.Add(-time.Hour), now.Add(-time.Hour)
		return r
	}
	onlyChange := func(t *testing.T, d *agent.Diff) agent.Change {
		t.Helper()
		if d == nil || len(d.Changes) != 1 {
			t.Fatalf("diff %+v, want one change", d)
		}
		return d.Changes[0]
	}

	t.Run("gone: relaunch", func(t *testing.T) {
		o := &observation{now: now, fits: true, has: true, rec: launched(3, 999991), failure: "CUDA out of memory"}
		d, held, err := s.decide(o, false)
		if err != nil || held != "" {
			t.Fatalf("decide: %v (held %q)", err, held)
		}
		c := onlyChange(t, d)
		det, _ := d.Detail.(*serverDetail)
		if d.Action != agent.Restart || c.Attr != "process" || c.Reason != agent.ReasonGone || det == nil || !det.stop || det.prev.PID != 999991 {
			t.Errorf("diff %+v (detail %+v), want the relaunch of the gone pid 999991, because gone", d, det)
		}
		if want := "generation 3's log shows CUDA out of memory"; len(d.Warnings) != 1 || d.Warnings[0] != want {
			t.Errorf("warnings %q, want %q", d.Warnings, want)
		}
	})

	t.Run("rejected change: revert", func(t *testing.T) {
		good := launched(2, 999992)
		good.Args = []string{"--port", "30000", "--tp", "1"} // the last good inputs differ
		failed := launched(3, 999993)
		failed.VerifiedAt, failed.LastGood = time.Time{}, identityOf(&good)
		d, _, err := s.decide(&observation{now: now, fits: true, has: true, rec: failed}, false)
		if err != nil {
			t.Fatal(err)
		}
		c := onlyChange(t, d)
		det, _ := d.Detail.(*serverDetail)
		if d.Action != agent.Restart || c.Reason != agent.ReasonGone || det == nil || !det.revert || !strings.HasPrefix(c.Note, "revert:") {
			t.Errorf("diff %+v (detail %+v), want the revert to generation 2's inputs", d, det)
		}
	})

	t.Run("rejected change: held by the loop, said once", func(t *testing.T) {
		asked := s.record() // what the plan asks for again: the rejected change
		back := launched(5, 999995)
		back.Args = []string{"--port", "30000", "--tp", "1"}
		back.RevertOf = 2
		back.Rejected = &rejectedChange{Generation: 4, Identity: &asked, At: now.Add(-time.Minute), Quote: "CUDA out of memory", RolledBackTo: 2}
		o := &observation{now: now, fits: true, has: true, rec: back, alive: true, probed: true}
		d, held, err := s.decide(o, true)
		if err != nil {
			t.Fatal(err)
		}
		if d.Action != agent.NoOp || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "generation 5 serves generation 2's command line, rolled back") || held != d.Warnings[0] {
			t.Errorf("diff %+v, held %q: want the hold, to be said", d, held)
		}
		o.said = true
		if _, held, _ := s.decide(o, true); held != "" {
			t.Errorf("said already, held %q: want nothing more to say", held)
		}
		// A person's apply (not the loop) tries it once more.
		if d, _, _ := s.decide(o, false); d.Action != agent.Restart || !strings.Contains(d.Changes[0].Note, "rolled back") {
			t.Errorf("apply: diff %+v, want the change tried again, marked rejected", d)
		}
	})

	t.Run("port held by the plan's server: adopt", func(t *testing.T) {
		owner := &proc.Stat{PID: 999996, PPID: 1, PGRP: 999996, Session: 999996, StartTicks: 77}
		o := &observation{now: now, fits: true, holder: portHolding{owner: owner, runsPlan: true, started: now.Add(-time.Hour)}}
		d, _, err := s.decide(o, false)
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := restest.RecordOf[*serverRecord](d)
		if d.Action != agent.Adopt || !ok || !rec.Adopted || rec.PID != 999996 || rec.StartTicks != 77 || rec.PGID != 999996 || rec.SID != 999996 {
			t.Errorf("diff %+v (record %+v), want the adoption of pid 999996", d, d.Record)
		}
		o.holder.notReady = "connection refused"
		if d, _, _ := s.decide(o, false); d.Action != agent.Adopt || len(d.Warnings) != 1 || !strings.Contains(d.Warnings[0], "is not ready (connection refused)") {
			t.Errorf("not ready: diff %+v, want the adoption, not ready within its grace", d)
		}
	})
}
