// Package trust is the agent's one rule for what another user could have written, as
// sshd's StrictModes: the agent runs as root, so a plan, a state record, a log directory
// or a download destination that another user could write or replace would let that
// user make root run, kill or overwrite what they choose. A path is trusted when it and
// every directory above it are owned by root or the agent's own user and are not
// writable by group or others. A root-owned directory with the sticky bit (/tmp) is
// accepted above the path: others may add entries there, but cannot rename or remove
// the agent's.
//
// Every refusal is an *Error whose message ends with the command that fixes it.
package trust

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrUntrusted is wrapped by every refusal.
var ErrUntrusted = errors.New("another user could have written it")

// Error is a path the agent refuses to trust, with the fix.
type Error struct {
	// Path is the path as given; Real is the one checked (symlinks resolved) when it
	// differs.
	Path, Real string
	// Problem says what is wrong ("is owned by uid 65534", "has mode 0777, writable by
	// group or others").
	Problem string
	// Fix is the command that fixes it.
	Fix string
}

func (e *Error) Error() string {
	where := e.Path
	if e.Real != "" && e.Real != e.Path {
		where = fmt.Sprintf("%s (→ %s)", e.Path, e.Real)
	}
	return fmt.Sprintf("%s %s; the agent runs as root and trusts nothing another user could have written: %s", where, e.Problem, e.Fix)
}

func (e *Error) Unwrap() error { return ErrUntrusted }

// euid is the agent's user; a variable so that tests of a non-root agent can set it.
var euid = os.Geteuid

// owners are the users whose files the agent trusts: root and itself.
func trustedOwner(uid uint32) bool { return uid == 0 || int(uid) == euid() }

// Dir checks a directory the agent keeps its own things in (the state directory, a log
// directory, a download's destination): the directory itself and every directory above
// it. A path that does not exist yet is checked from its nearest existing ancestor up,
// since the agent creates the rest itself. The directory itself must not be sticky and
// writable by others: the sticky bit protects only what is already there.
func Dir(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	top := abs
	for {
		if _, err := os.Lstat(top); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		parent := filepath.Dir(top)
		if parent == top {
			break
		}
		top = parent
	}
	real, err := filepath.EvalSymlinks(top)
	if err != nil {
		return err
	}
	return chain(top, real, top == abs)
}

// File checks a file the agent reads and acts on (a plan, a -var-file): the file after
// symlinks, and every directory above it. dirPlan says the file is one of a directory
// plan's files, where a sticky parent is no defence (another user could add a file to
// the plan), so the directory holding it must not be writable by others at all.
func File(path string, dirPlan bool) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if err := check(path, real, fi, false); err != nil {
		return err
	}
	dir := filepath.Dir(real)
	di, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if err := check(dir, dir, di, !dirPlan); err != nil {
		return err
	}
	return above(dir)
}

// chain checks real (shown as shown), which is the directory itself when self, and every
// directory above it.
func chain(shown, real string, self bool) error {
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &Error{Path: shown, Real: real, Problem: "is not a directory", Fix: "move it aside: mv " + real + " " + real + ".old"}
	}
	if err := check(shown, real, fi, !self); err != nil {
		return err
	}
	return above(real)
}

// above checks every directory above dir (a real path), sticky root-owned ones accepted.
func above(dir string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if err := check(d, d, fi, true); err != nil {
			return err
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// check applies the rule to one file or directory. stickyOK accepts a directory that is
// writable by others when it is root-owned and sticky.
func check(shown, real string, fi fs.FileInfo, stickyOK bool) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if !trustedOwner(st.Uid) {
		who := "root"
		if euid() != 0 {
			who = fmt.Sprintf("root or uid %d", euid())
		}
		return &Error{Path: shown, Real: real, Problem: fmt.Sprintf("is owned by uid %d, not %s", st.Uid, who),
			Fix: fmt.Sprintf("check what it holds, then chown root:root %s", real)}
	}
	perm := fi.Mode().Perm()
	if perm&0o022 == 0 {
		return nil
	}
	if fi.IsDir() && fi.Mode()&fs.ModeSticky != 0 && st.Uid == 0 && stickyOK {
		return nil
	}
	return &Error{Path: shown, Real: real, Problem: fmt.Sprintf("has mode %04o, writable by group or others", perm),
		Fix: "check what it holds, then chmod go-w " + real}
}

// OpenFile opens path without following a symlink at its last element (O_NOFOLLOW) and
// checks that what it opened is a regular file owned by root or the agent, not writable
// by group or others and with one link: a file another user planted or linked there is
// refused, and nothing is written through it.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	f, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW, perm)
	if errors.Is(err, syscall.ELOOP) {
		return nil, &Error{Path: path, Problem: "is a symlink, which the agent never opens there",
			Fix: "check where it points and who made it, then rm " + path}
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, &Error{Path: path, Problem: "is not a regular file", Fix: "check what it is, then rm " + path}
	}
	if err := check(path, path, fi, false); err != nil {
		f.Close()
		return nil, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		f.Close()
		return nil, &Error{Path: path, Problem: fmt.Sprintf("has %d hard links, so writing it would write another file too", st.Nlink),
			Fix: "check what else it is, then rm " + path}
	}
	return f, nil
}
