package proc

import (
	"slices"
	"testing"
)

// Target.Members is the one rule for which processes are a launch's: a stop stops them,
// and observation (the server kind, before it calls a port holder foreign) asks the same
// question through it. The server kind once had a rule of its own; each case below says where that rule answered otherwise ("before") and why the stop's
// answer is the right one for both. A process wrongly called the launch's is
// stopped with it (a stranger killed, or a port still held after the stop); one wrongly
// called foreign blocks the relaunch with "port held" by the launch's own process.
func TestMembersIsTheOneRule(t *testing.T) {
	t.Parallel()
	const marker = "AGENT_SERVER=server.qwen#3@1"
	// The launch: leader 100 started at tick 1000, its own group and session (Setsid).
	lead := Stat{PID: 100, PPID: 1, PGRP: 100, Session: 100, StartTicks: 1000, State: 'S'}
	target := Target{Leader: lead.Identity(), PGID: 100, SID: 100, Marker: marker}
	proc := func(pid, ppid, pgrp, sid int, start uint64) Stat {
		return Stat{PID: pid, PPID: ppid, PGRP: pgrp, Session: sid, StartTicks: start, State: 'S'}
	}
	zombie := lead
	zombie.State = 'Z'
	cases := []struct {
		name   string
		target Target
		all    []Stat
		marked []int // PIDs whose environment carries the marker
		pid    int   // the process asked about (the one on the port)
		want   bool
		before bool // the server kind's own rule
	}{
		{name: "leader alive: a child in its group", target: target,
			all: []Stat{lead, proc(101, 100, 100, 100, 1001)}, pid: 101, want: true, before: true},
		{name: "leader a zombie not yet reaped still anchors its group", target: target,
			all: []Stat{zombie, proc(101, 1, 100, 100, 1001)}, pid: 101, want: true, before: true},
		{name: "leader reaped, no marker: the group's number may be reused", target: target,
			all: []Stat{proc(101, 1, 100, 100, 1001)}, pid: 101, want: false, before: false},
		{name: "leader reaped, the marker proves it", target: target,
			all: []Stat{proc(101, 1, 100, 100, 1001)}, marked: []int{101}, pid: 101, want: true, before: true},
		{name: "leader's PID reused by another start: its group is a stranger's", target: target,
			all: []Stat{proc(100, 1, 100, 100, 5000), proc(101, 100, 100, 100, 5001)}, pid: 101, want: false, before: false},
		// Differed: SGLang's workers and a setsid'd helper leave group and session; the
		// stop follows descent, so the process dies with the launch and must not block it.
		{name: "setsid child of the live leader, no marker", target: target,
			all: []Stat{lead, proc(101, 100, 101, 101, 1001)}, pid: 101, want: true, before: false},
		// Differed: a child that cleared its environment still descends from a marked
		// leftover, which the stop stops with its descendants.
		{name: "leader reaped; child of a marked leftover, itself unmarked", target: target,
			all: []Stat{proc(101, 1, 100, 100, 1001), proc(102, 101, 102, 102, 1002)}, marked: []int{101}, pid: 102, want: true, before: false},
		// Differed: the leader is the launch by its identity wherever it moved itself.
		{name: "leader alive, moved to a group and session of its own", target: target,
			all: []Stat{proc(100, 1, 300, 300, 1000)}, pid: 100, want: true, before: false},
		// Differed: a group the leader joined (not named after it) is signalled whole,
		// kill(-PGID), so its older members die with the stop too.
		{name: "group not the leader's own: an older member", target: Target{Leader: lead.Identity(), PGID: 50, Marker: marker},
			all: []Stat{proc(100, 50, 50, 7, 1000), proc(50, 1, 50, 7, 900)}, pid: 50, want: true, before: false},
		{name: "the leader's own group: a process older than the leader is a stranger", target: target,
			all: []Stat{lead, proc(101, 1, 100, 100, 999)}, pid: 101, want: false, before: false},
		// Differed: what the stop never touches (init, the agent and its ancestors) is
		// not the launch's, even carrying the marker: calling it so would relaunch into
		// a port the stop left held.
		{name: "init carrying the marker", target: target,
			all: []Stat{proc(1, 0, 1, 1, 1)}, marked: []int{1}, pid: 1, want: false, before: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			members := c.target.Members(c.all, nil, func(pid int) bool { return slices.Contains(c.marked, pid) }, func(pid int) bool { return pid <= 1 })
			got := slices.ContainsFunc(members, func(s Stat) bool { return s.PID == c.pid })
			if got != c.want {
				t.Errorf("pid %d a member = %v, want %v (the server kind's own rule said %v); members %+v", c.pid, got, c.want, c.before, members)
			}
		})
	}
}
