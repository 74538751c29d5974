package coord

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/coord/etcdtest"
)

func driverRequest(bootID string) HostRequest {
	return HostRequest{Group: "gpu-hosts", Max: 1, Cause: "driver", Detail: "driver 580.95.05 → 590.48.01", BootID: bootID,
		Members: map[string][]string{"qwen": {"server.qwen"}}, Slots: map[string]int{"qwen": 1}}
}

// Two hosts: kpro6 takes the group's one host permit, kpro7 is refused with kpro6 named;
// the permit outlives kpro6's lease (a reboot is longer than any lease) and is released
// only by kpro6 itself.
func TestHostPermitOutlivesTheLease(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro6", MinLease)
	b := open(t, cl, "kpro7", MinLease)
	p, err := a.TakeHost(ctx(t), driverRequest("boot-1"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Host != "kpro6" || p.State != HostStopping || p.BootID != "boot-1" || p.Cause != "driver" {
		t.Fatalf("permit %+v", p)
	}
	if err := a.UpdateHost(ctx(t), "gpu-hosts", func(p *HostPermit) { p.State, p.RebootID = HostRebooting, "boot-1" }); err != nil {
		t.Fatal(err)
	}
	refused := func(when string) {
		t.Helper()
		_, err := b.TakeHost(ctx(t), HostRequest{Group: "gpu-hosts", Max: 1, Cause: "drain", BootID: "b"})
		var ref *HostRefusal
		if !errors.As(err, &ref) || len(ref.Holders) != 1 || ref.Holders[0].Host != "kpro6" {
			t.Fatalf("%s: kpro7's take: %v, want a refusal naming kpro6", when, err)
		}
		if !strings.Contains(err.Error(), "kpro6 rebooting since") || !strings.Contains(err.Error(), "driver 580.95.05 → 590.48.01") {
			t.Errorf("%s: refusal %q does not say who holds it and why", when, err)
		}
	}
	refused("while kpro6 holds it")

	// kpro6 goes down (its agent killed by the reboot): its lease lapses, the permit stays.
	a.Abandon()
	time.Sleep(2*MinLease + time.Second)
	refused("after kpro6's lease lapsed")

	// kpro6 back: the same permit, found again; released by it.
	a2 := open(t, cl, "kpro6", MinLease)
	mine, err := a2.MyHostPermit(ctx(t), "gpu-hosts")
	if err != nil || mine == nil || mine.Revision != p.Revision || mine.State != HostRebooting || mine.RebootID != "boot-1" {
		t.Fatalf("kpro6 after its restart finds %+v, %v; want its permit (revision %d, rebooting)", mine, err, p.Revision)
	}
	again, err := a2.TakeHost(ctx(t), driverRequest("boot-2"))
	if err != nil || again.Revision != p.Revision {
		t.Fatalf("take again: %+v, %v; want the permit kpro6 holds", again, err)
	}
	if err := b.ReleaseHost(ctx(t), "gpu-hosts"); err != nil {
		t.Fatal(err)
	}
	refused("after kpro7 released a permit it does not hold")
	if err := a2.ReleaseHost(ctx(t), "gpu-hosts"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TakeHost(ctx(t), HostRequest{Group: "gpu-hosts", Max: 1, Cause: "drain", BootID: "b"}); err != nil {
		t.Fatalf("kpro7 after kpro6 released: %v", err)
	}
	// Another host group has its own permits.
	if _, err := a2.TakeHost(ctx(t), HostRequest{Group: "cpu-hosts", Max: 1, Cause: "drain"}); err != nil {
		t.Fatalf("another host group: %v", err)
	}
}

// An operator frees the permit of a host that never came back: logged with who and when.
func TestFleetReleaseFreesAHostPermit(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro6", MinLease)
	b := open(t, cl, "kpro7", MinLease)
	if _, err := a.TakeHost(ctx(t), driverRequest("boot-1")); err != nil {
		t.Fatal(err)
	}
	a.Abandon()
	if _, err := b.ForceReleaseHost(ctx(t), "kpro7", "alice", ""); err == nil || !strings.Contains(err.Error(), "held by: kpro6 in gpu-hosts") {
		t.Errorf("release of a host without a permit: %v", err)
	}
	before := time.Now()
	freed, err := b.ForceReleaseHost(ctx(t), "kpro6", "alice@ops1", "board replaced")
	if err != nil || len(freed) != 1 || freed[0].Host != "kpro6" {
		t.Fatalf("fleet release: %+v, %v", freed, err)
	}
	if _, err := b.TakeHost(ctx(t), driverRequest("b")); err != nil {
		t.Fatalf("kpro7 after the release: %v", err)
	}
	log, err := b.HostReleases(ctx(t))
	if err != nil || len(log) != 1 {
		t.Fatalf("release log %+v, %v", log, err)
	}
	if r := log[0]; r.By != "alice@ops1" || r.Reason != "board replaced" || r.Permit.Host != "kpro6" || r.At.Before(before.Add(-time.Second)) {
		t.Errorf("logged %+v", r)
	}
	// kpro6's agent, back later, finds no permit: its update says it was freed.
	a2 := open(t, cl, "kpro6", MinLease)
	if err := a2.UpdateHost(ctx(t), "gpu-hosts", func(p *HostPermit) {}); err == nil || !strings.Contains(err.Error(), "fleet release") {
		t.Errorf("update of a freed permit: %v", err)
	}
}

// A host under disruption counts as its servers down in their rollout groups, and a host
// disruption waits while a rollout group has members down elsewhere.
func TestHostDisruptionCountsAsServersDown(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro6", MinLease)
	b := open(t, cl, "kpro7", MinLease)
	if _, err := a.TakeHost(ctx(t), driverRequest("boot-1")); err != nil {
		t.Fatal(err)
	}
	_, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 1)
	var ref *Refusal
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), "server.qwen on kpro6 (host disruption: kpro6 stopping since") {
		t.Fatalf("rollout permit while kpro6 is under disruption: %v", err)
	}
	if _, err := b.Acquire(ctx(t), "qwen", "server.qwen", "restart", 2); err != nil {
		t.Fatalf("with room for two: %v", err)
	}
	if err := a.ReleaseHost(ctx(t), "gpu-hosts"); err != nil {
		t.Fatal(err)
	}
	// kpro7's server is down now: kpro6's host disruption waits for it.
	_, err = a.TakeHost(ctx(t), driverRequest("boot-1"))
	var href *HostRefusal
	if !errors.As(err, &href) || href.Rollout != "qwen" || !strings.Contains(err.Error(), "server.qwen on kpro7") {
		t.Fatalf("host permit while kpro7's server is down: %v", err)
	}
	if err := b.Release(ctx(t), "qwen", "server.qwen"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TakeHost(ctx(t), driverRequest("boot-1")); err != nil {
		t.Fatalf("after kpro7's server came back: %v", err)
	}
}

// A step of kpro6's disruption fails: the host group stops fleet-wide (kpro7 is refused
// although max_unavailable = 2 leaves room), with the host, the step and the quoted error;
// the same failure again writes nothing; kpro6 itself resumes; the stop ends when kpro6
// releases its permit (verified) or an operator frees it.
func TestFailedHostStopsItsGroup(t *testing.T) {
	cl := etcdtest.Start(t, 1, etcdtest.Options{})
	a := open(t, cl, "kpro6", MinLease)
	b := open(t, cl, "kpro7", MinLease)
	c := open(t, cl, "kpro8", MinLease)
	two := func(boot string) HostRequest {
		r := driverRequest(boot)
		r.Max, r.Slots = 2, map[string]int{"qwen": 3}
		return r
	}
	if rec, err := a.FailHost(ctx(t), "gpu-hosts", StepInstall, "x", "boot-1"); rec || err != nil {
		t.Fatalf("a failure without a permit: recorded %v, %v", rec, err)
	}
	if _, err := a.TakeHost(ctx(t), two("boot-1")); err != nil {
		t.Fatal(err)
	}
	const why = "installer failed: exit status 1; last lines:\nERROR: Unable to build the NVIDIA kernel module."
	if rec, err := a.FailHost(ctx(t), "gpu-hosts", StepInstall, why, "boot-1"); !rec || err != nil {
		t.Fatalf("record the failure: %v, %v", rec, err)
	}
	first, _ := a.MyHostPermit(ctx(t), "gpu-hosts")
	if first.State != HostFailed || first.Failure == nil || first.Failure.Step != StepInstall || first.Failure.Error != why || first.Failure.BootID != "boot-1" {
		t.Fatalf("failed permit %+v (failure %+v)", first, first.Failure)
	}
	// The loop retries and fails the same way: nothing written.
	for range 3 {
		if rec, err := a.FailHost(ctx(t), "gpu-hosts", StepInstall, why, "boot-1"); rec || err != nil {
			t.Fatalf("the same failure again: recorded %v, %v", rec, err)
		}
	}
	if again, _ := a.MyHostPermit(ctx(t), "gpu-hosts"); !again.Updated.Equal(first.Updated) || !again.Failure.At.Equal(first.Failure.At) {
		t.Fatalf("the same failure rewrote the permit: %+v, was %+v", again, first)
	}
	stopped := func(who *Client, when, failure string) {
		t.Helper()
		_, err := who.TakeHost(ctx(t), two("b"))
		var ref *HostRefusal
		if !errors.As(err, &ref) || ref.Failed == nil || ref.Failed.Host != "kpro6" {
			t.Fatalf("%s: %s's take: %v, want the group stopped by kpro6", when, who.Host(), err)
		}
		for _, want := range []string{"host group gpu-hosts is stopped: kpro6 failed at " + failure + " since ",
			"fix kpro6 (it resumes by itself once verified) or agent fleet release kpro6 PLAN"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: refusal %q does not say %q", when, err, want)
			}
		}
	}
	stopped(b, "max_unavailable 2, one host failed", `install: "installer failed: exit status 1; last lines:\nERROR: Unable to build the NVIDIA kernel module."`)
	// kpro6 resumes its own disruption (the operator fixed the installer): its permit.
	if p, err := a.TakeHost(ctx(t), two("boot-1")); err != nil || p.Revision != first.Revision {
		t.Fatalf("kpro6 resumes: %+v, %v", p, err)
	}
	// A new failure (another step, or another error) is recorded; a later step in
	// progress keeps the failure until kpro6 is verified.
	if rec, err := a.FailHost(ctx(t), "gpu-hosts", StepReboot, "systemctl reboot: exit status 1", "boot-1"); !rec || err != nil {
		t.Fatalf("another failure: %v, %v", rec, err)
	}
	if err := a.UpdateHost(ctx(t), "gpu-hosts", func(p *HostPermit) { p.State, p.RebootID = HostRebooting, "boot-1" }); err != nil {
		t.Fatal(err)
	}
	p, _ := a.MyHostPermit(ctx(t), "gpu-hosts")
	if s := p.String(); !strings.Contains(s, `kpro6 failed at reboot: "systemctl reboot: exit status 1" since`) || !strings.Contains(s, "now rebooting") {
		t.Errorf("a failed permit that went on: %q", s)
	}
	stopped(c, "after kpro6 went on to its reboot", `reboot: "systemctl reboot: exit status 1"`)
	// Verified: released, the group goes on.
	if err := a.ReleaseHost(ctx(t), "gpu-hosts"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TakeHost(ctx(t), two("b")); err != nil {
		t.Fatalf("kpro7 after kpro6 was verified: %v", err)
	}
	// kpro7 fails; an operator frees it: kpro8 goes on.
	if _, err := b.FailHost(ctx(t), "gpu-hosts", StepStop, "server.qwen did not stop in 2s", "b"); err != nil {
		t.Fatal(err)
	}
	stopped2, err := c.TakeHost(ctx(t), two("c"))
	if err == nil || !strings.Contains(err.Error(), "kpro7 failed at stop") {
		t.Fatalf("kpro8 while kpro7 failed: %+v, %v", stopped2, err)
	}
	if _, err := c.ForceReleaseHost(ctx(t), "kpro7", "alice@ops1", "servers stopped by hand"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TakeHost(ctx(t), two("c")); err != nil {
		t.Fatalf("kpro8 after kpro7 was freed: %v", err)
	}
}
