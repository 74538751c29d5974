package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// KmsgFollower reads the kernel log's records as they come. On a host it reads
// /dev/kmsg, a character device where each read returns one record and a
// non-blocking read with nothing new returns EAGAIN; under AGENT_HOST_ROOT the path is a
// regular file that a test appends to, read from where the last Read stopped (a
// truncated or replaced file is read again from its start). Either way it starts at the
// oldest record the kernel still holds, so an agent that starts after a fault still sees
// it; the judgement of each GPU remembers the sequence numbers it has acted on.
type KmsgFollower struct {
	path    string
	f       *os.File // the regular file
	fd      int      // the device, read with read(2) itself: an *os.File of a non-blocking character device would park on EAGAIN in Go's poller
	device  bool
	off     int64
	ino     uint64
	partial []byte
	buf     []byte
}

// NewKmsgFollower follows the kernel log at path. Nothing is opened before Read.
func NewKmsgFollower(path string) *KmsgFollower {
	return &KmsgFollower{path: path}
}

// kmsgRecordMax is the largest record the kernel writes to /dev/kmsg (PRINTK_MESSAGE_MAX
// is 2048 before the header and escapes); a read with a smaller buffer fails with EINVAL.
const kmsgRecordMax = 16 << 10

// Read calls fn for each whole record written since the last Read. A path that does not
// exist reads as an empty log (a host or container without /dev/kmsg).
func (k *KmsgFollower) Read(fn func(KmsgRecord)) error {
	if err := k.open(); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("gpu: kernel log %s: %w", k.path, err)
	}
	if k.device {
		return k.readDevice(fn)
	}
	return k.readFile(fn)
}

func (k *KmsgFollower) open() error {
	if k.f != nil || k.device {
		return nil
	}
	fi, err := os.Stat(k.path)
	if err != nil {
		return err
	}
	k.buf = make([]byte, kmsgRecordMax)
	if fi.Mode()&os.ModeCharDevice != 0 {
		fd, err := syscall.Open(k.path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: k.path, Err: err}
		}
		k.fd, k.device = fd, true
		return nil
	}
	k.f, err = os.Open(k.path)
	return err
}

// readDevice reads /dev/kmsg: one record per read, EAGAIN at the end, EPIPE when the
// kernel overwrote records before they were read (the next read goes on from the oldest
// one left).
func (k *KmsgFollower) readDevice(fn func(KmsgRecord)) error {
	for {
		n, err := syscall.Read(k.fd, k.buf)
		switch {
		case errors.Is(err, syscall.EAGAIN):
			return nil
		case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("gpu: kernel log %s: %w", k.path, err)
		case n <= 0:
			return nil
		}
		line, _, _ := bytes.Cut(k.buf[:n], []byte("\n"))
		if r, ok := ParseKmsgRecord(string(line)); ok {
			fn(r)
		}
	}
}

// readFile reads what a regular file grew by since the last Read, whole lines only.
func (k *KmsgFollower) readFile(fn func(KmsgRecord)) error {
	fi, err := k.f.Stat()
	if err != nil {
		return fmt.Errorf("gpu: kernel log %s: %w", k.path, err)
	}
	ino := inode(fi)
	if now, err := os.Stat(k.path); err == nil && inode(now) != ino {
		k.Close() // replaced: the new file is read from its start
		if err := k.open(); err != nil {
			return fmt.Errorf("gpu: kernel log %s: %w", k.path, err)
		}
		return k.readFile(fn)
	}
	if fi.Size() < k.off || k.ino != 0 && k.ino != ino {
		k.off, k.partial = 0, nil
	}
	k.ino = ino
	for k.off < fi.Size() {
		n, err := k.f.ReadAt(k.buf, k.off)
		if n == 0 && err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("gpu: kernel log %s: %w", k.path, err)
		}
		if n == 0 {
			break
		}
		k.off += int64(n)
		k.lines(k.buf[:n], fn)
	}
	return nil
}

// lines calls fn for each whole line of data, keeping an unfinished last line for the
// next call.
func (k *KmsgFollower) lines(data []byte, fn func(KmsgRecord)) {
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			k.partial = append(k.partial, data...)
			return
		}
		line := data[:i]
		if len(k.partial) > 0 {
			line = append(k.partial, line...)
			k.partial = k.partial[:0]
		}
		if r, ok := ParseKmsgRecord(string(line)); ok {
			fn(r)
		}
		data = data[i+1:]
	}
}

// Close closes the log; a later Read opens it again from its start.
func (k *KmsgFollower) Close() {
	if k.f != nil {
		k.f.Close()
	}
	if k.device {
		syscall.Close(k.fd)
	}
	k.f, k.device, k.off, k.ino, k.partial = nil, false, 0, 0, nil
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
