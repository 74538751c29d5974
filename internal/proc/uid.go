package proc

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
)

// UIDs returns the real and effective user IDs of pid, from the Uid line of
// /proc/PID/status. A server's user is part of its identity: a process of
// another user running the same command line is not the agent's to adopt.
func (fs FS) UIDs(pid int) (real, effective uint32, err error) {
	b, err := fs.readPID(pid, "status")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("Uid:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) < 2 {
			break
		}
		r, err1 := strconv.ParseUint(string(f[0]), 10, 32)
		e, err2 := strconv.ParseUint(string(f[1]), 10, 32)
		if err1 != nil || err2 != nil {
			break
		}
		return uint32(r), uint32(e), nil
	}
	return 0, 0, fmt.Errorf("pid %d: %w: no Uid line in status", pid, ErrBadStat)
}
