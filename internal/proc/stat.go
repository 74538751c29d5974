package proc

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Stat is the part of /proc/PID/stat the agent relies on.
type Stat struct {
	PID     int
	Comm    string // the kernel's short name; may contain spaces and ')'
	State   byte   // R, S, D, Z, T, t, X, I, ...
	PPID    int
	PGRP    int
	Session int
	// StartTicks is the start time in clock ticks since boot (field 22).
	// Together with PID it names a process uniquely across PID reuse.
	StartTicks uint64
}

// Identity returns the PID and start time of s.
func (s Stat) Identity() Identity { return Identity{PID: s.PID, StartTicks: s.StartTicks} }

// Dead reports whether s describes a process that has exited: a zombie ('Z')
// or one being torn down ('X', or 'x' on kernels 2.6.33 to 3.13). Such a process holds no memory, sockets or
// GPU context any more, and on hosts whose PID 1 does not reap orphans it may
// stay a zombie for ever, so the agent counts it as gone.
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' || s.State == 'x' }

// ErrBadStat is wrapped by ParseStat errors so callers can tell a malformed
// stat line from a missing process.
var ErrBadStat = errors.New("malformed stat line")

// statFields is the number of fields after the comm that ParseStat needs:
// state (field 3) through starttime (field 22).
const statFields = 22 - 2

// ParseStat parses the content of /proc/PID/stat. The comm field is the
// text between the first '(' and the LAST ')', because a process can name
// itself "a) b (c" and only the last parenthesis is the kernel's. It never
// panics; any garbage is an error wrapping ErrBadStat.
func ParseStat(b []byte) (Stat, error) {
	open := bytes.IndexByte(b, '(')
	closing := bytes.LastIndexByte(b, ')')
	if open < 0 || closing < open {
		return Stat{}, fmt.Errorf("%w: no (comm)", ErrBadStat)
	}
	var s Stat
	pid, err := parseInt(bytes.TrimSpace(b[:open]))
	if err != nil {
		return Stat{}, fmt.Errorf("%w: pid: %w", ErrBadStat, err)
	}
	s.PID = pid
	s.Comm = string(b[open+1 : closing])

	f := bytes.Fields(b[closing+1:])
	if len(f) < statFields {
		return Stat{}, fmt.Errorf("%w: %d fields after comm, want at least %d", ErrBadStat, len(f), statFields)
	}
	if len(f[0]) != 1 || !isLetter(f[0][0]) {
		return Stat{}, fmt.Errorf("%w: state %q", ErrBadStat, f[0])
	}
	s.State = f[0][0]
	for _, p := range []struct {
		name string
		dst  *int
		v    []byte
	}{
		{"ppid", &s.PPID, f[1]},
		{"pgrp", &s.PGRP, f[2]},
		{"session", &s.Session, f[3]},
	} {
		if string(p.v) == "-1" {
			// "none": seen for a process that is exiting (its group and session already
			// released). It is read as 0, which every caller already takes for "no
			// group/session to signal" (as for one outside the PID namespace): a -1 kept
			// as a group id would make kill(-pgid) signal PID 1.
			*p.dst = 0
			continue
		}
		if *p.dst, err = parseInt(p.v); err != nil {
			return Stat{}, fmt.Errorf("%w: %s: %w", ErrBadStat, p.name, err)
		}
	}
	if s.StartTicks, err = strconv.ParseUint(string(f[statFields-1]), 10, 64); err != nil {
		return Stat{}, fmt.Errorf("%w: starttime: %w", ErrBadStat, err)
	}
	return s, nil
}

// parseInt parses a non-negative decimal that fits a PID.
func parseInt(b []byte) (int, error) {
	n, err := strconv.ParseUint(string(b), 10, 31)
	if err != nil {
		return 0, err
	}
	return int(n), nil
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
