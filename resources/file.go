package resources

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/atomicfile"
	"github.com/agent-dev/agent/internal/textdiff"
)

// File is a regular file on the host: a nouveau blacklist, a token, a unit file. The
// file kind (resources/file) binds one per block; the nvidia_driver kind writes its
// nouveau blacklist with one.
//
// Unset mode, owner and group are not managed on an existing file; a new file gets
// mode 0644 and the agent's owner. The content comes from `content` or from `source`, a
// local file read at plan time (relative to the plan's directory).
type File struct {
	addr      string
	path      string
	absent    bool
	destroy   bool // absent because of agent destroy, not the plan
	content   []byte
	source    string // when content comes from a file, read at Check time
	mode      *fs.FileMode
	owner     string
	group     string
	sensitive bool
}

// FileSpec is a File as a plan declares it.
type FileSpec struct {
	Addr, Path string
	Absent     bool   // ensure = "absent"
	Content    []byte // the content, unless Source names a local file read at Check time
	Source     string
	Mode       *fs.FileMode // nil: not managed on an existing file, 0644 on a new one
	Owner      string
	Group      string
	Sensitive  bool
}

// NewFile is the file spec declares.
func NewFile(spec FileSpec) *File {
	return &File{addr: spec.Addr, path: spec.Path, absent: spec.Absent, content: spec.Content, source: spec.Source,
		mode: spec.Mode, owner: spec.Owner, group: spec.Group, sensitive: spec.Sensitive}
}

var (
	_ agent.Resource = (*File)(nil)
	_ agent.Ensurer  = (*File)(nil)
)

// Absent reports whether the plan says ensure = "absent".
func (f *File) Absent() bool { return f.absent && !f.destroy }

// AsAbsent is the file as agent destroy removes it.
func (f *File) AsAbsent() agent.Resource {
	c := *f
	c.absent, c.destroy, c.content, c.source = true, true, nil, ""
	return &c
}

func Deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// fileDetail is what Check found, for Apply.
type fileDetail struct {
	write   bool // content differs or the file is missing
	content []byte
	chmod   *fs.FileMode
	uid     int // -1: leave
	gid     int
	remove  bool
	// seen is the content found on the host, as a hash ("" when there was none): what a
	// saved plan's fingerprint binds it to (file_fingerprint.go).
	seen string
}

// Check observes the file and compares it with the plan.
func (f *File) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	st, err := os.Lstat(f.path)
	exists := err == nil
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if exists && !st.Mode().IsRegular() {
		what := "a directory"
		if st.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(f.path)
			what = "a symlink to " + target
		} else if !st.IsDir() {
			what = "not a regular file (" + st.Mode().Type().String() + ")"
		}
		return nil, fmt.Errorf("%s is %s; the file resource manages regular files only: move it aside, or point path elsewhere", f.path, what)
	}
	if f.absent {
		if !exists {
			return agent.NoChange(), nil
		}
		why := agent.ReasonEnsureAbsent
		if f.destroy {
			why = agent.ReasonDestroy
		}
		d := &agent.Diff{Detail: &fileDetail{remove: true}}
		d.Add(agent.Removed("path", f.path).Because(agent.Deletes, why))
		return d.Derive(), nil
	}

	want := f.content
	if f.source != "" {
		want, err = os.ReadFile(f.source)
		if err != nil {
			return nil, fmt.Errorf("source: %w", err)
		}
	}
	uid, gid, err := f.ids()
	if err != nil {
		return nil, err
	}
	det := &fileDetail{content: want, uid: -1, gid: -1}
	d := &agent.Diff{Detail: det}
	if !exists {
		det.write = true
		mode := fs.FileMode(0o644)
		if f.mode != nil {
			mode = *f.mode
		}
		det.chmod = &mode
		det.uid, det.gid = uid, gid
		d.Add(agent.Added("path", f.path))
		d.Add(agent.Added("mode", fmtMode(mode)))
		if f.owner != "" {
			d.Add(agent.Added("owner", f.owner))
		}
		if f.group != "" {
			d.Add(agent.Added("group", f.group))
		}
		c := agent.Added("content", agent.Raw(fmt.Sprintf("(%d bytes)", len(want))))
		c.Sensitive = f.sensitive
		c.Text = textdiff.Unified(f.path, nil, want)
		d.Add(c)
		for i := range d.Changes {
			d.Changes[i] = d.Changes[i].Because(agent.Creates, agent.ReasonMissing)
		}
		return d.Derive(), nil
	}

	have, err := readNoFollow(f.path, st.Size())
	if err != nil {
		return nil, err
	}
	det.seen = contentHash(have)
	if !bytes.Equal(have, want) {
		det.write = true
		c := agent.Change{Attr: "content", HasOld: true, HasNew: true,
			Old: agent.Raw(fmt.Sprintf("(%d bytes)", len(have))), New: agent.Raw(fmt.Sprintf("(%d bytes)", len(want))), Sensitive: f.sensitive}
		c.Text = textdiff.Unified(f.path, have, want)
		d.Add(c)
	}
	perm := st.Mode().Perm() | st.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	if f.mode != nil && modeBits(perm) != modeBits(*f.mode) {
		det.chmod = f.mode
		d.Add(agent.Set("mode", fmtMode(perm), fmtMode(*f.mode)))
	} else if det.write {
		det.chmod = &perm // a rewrite keeps the current mode
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	if sys != nil && uid >= 0 && int(sys.Uid) != uid {
		det.uid = uid
		d.Add(agent.Set("owner", userName(int(sys.Uid)), f.owner))
	}
	if sys != nil && gid >= 0 && int(sys.Gid) != gid {
		det.gid = gid
		d.Add(agent.Set("group", groupName(int(sys.Gid)), f.group))
	}
	if det.write && sys != nil {
		// A rewrite creates a new inode: carry the current owner over unless it changes.
		if det.uid < 0 {
			det.uid = int(sys.Uid)
		}
		if det.gid < 0 {
			det.gid = int(sys.Gid)
		}
	}
	return d.Derive(), nil // no changes: a no-op that keeps what it saw
}

// Apply writes, re-permissions, re-owns or removes the file as Check decided.
func (f *File) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) error {
	det := d.Detail.(*fileDetail)
	switch {
	case det.remove:
		return atomicfile.Remove(f.path)
	case det.write:
		dir := filepath.Dir(f.path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		return atomicfile.Write(f.path, det.content, atomicfile.Options{Mode: *det.chmod, UID: det.uid, GID: det.gid})
	}
	if det.chmod != nil {
		if err := os.Chmod(f.path, *det.chmod); err != nil {
			return err
		}
	}
	if det.uid >= 0 || det.gid >= 0 {
		if err := os.Lchown(f.path, det.uid, det.gid); err != nil {
			return err
		}
	}
	return nil
}

// ids resolves owner and group (names or numbers); -1 when not managed.
func (f *File) ids() (uid, gid int, err error) {
	uid, gid = -1, -1
	if f.owner != "" {
		if n, err := strconv.Atoi(f.owner); err == nil {
			uid = n
		} else if u, err := user.Lookup(f.owner); err == nil {
			uid, _ = strconv.Atoi(u.Uid)
		} else {
			return 0, 0, fmt.Errorf("owner %q: no such user on this host", f.owner)
		}
	}
	if f.group != "" {
		if n, err := strconv.Atoi(f.group); err == nil {
			gid = n
		} else if g, err := user.LookupGroup(f.group); err == nil {
			gid, _ = strconv.Atoi(g.Gid)
		} else {
			return 0, 0, fmt.Errorf("group %q: no such group on this host", f.group)
		}
	}
	return uid, gid, nil
}

func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// OctalMode converts chmod(1)-style bits to an fs.FileMode, whose setuid, setgid and
// sticky bits are flags rather than the octal 4000, 2000, 1000.
func OctalMode(b uint32) fs.FileMode {
	m := fs.FileMode(b & 0o777)
	if b&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if b&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if b&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func fmtMode(m fs.FileMode) string { return fmt.Sprintf("%04o", modeBits(m)) }

func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return strconv.Itoa(uid)
}

func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}

// readNoFollow reads the regular file at path, whose size Lstat reported, without
// following a symlink: one swapped in since the Lstat fails (ELOOP) instead of being
// read. Plain syscalls, not os.ReadFile: a no-op plan reads every managed file, and
// os.File's poller registration and fstat were a third of a 3,000-file plan's read cost.
func readNoFollow(path string, size int64) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	// One byte more than the size, so a file that grew since the Lstat is read whole.
	buf := make([]byte, 0, size+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := syscall.Read(fd, buf[len(buf):cap(buf)])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}
