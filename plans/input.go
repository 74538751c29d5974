package plans

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrNotRegular is wrapped by the refusal of a plan input that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// readInput reads one plan input (a plan file, a -var-file, a file() argument), at most
// limit bytes. It opens regular files only: a FIFO put in a var file's place would block
// an open or a read until someone writes it (a reload that never ends, a loop deaf to
// SIGTERM), and a device never ends. The open is non-blocking (a FIFO's open waits for a
// writer otherwise) and what was opened is checked before a byte is read, so anything
// else is refused at once, with its path and what it is.
func readInput(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.ENXIO) { // a socket cannot be opened at all
		if fi, lerr := os.Stat(path); lerr == nil && !fi.Mode().IsRegular() {
			return nil, notRegular(path, fi.Mode())
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes; plan inputs are limited to %d", path, fi.Size(), limit)
	}
	// The size may grow between Stat and the read: read one byte past the limit to see.
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s grew past %d bytes while being read; plan inputs are limited to %d", path, limit, limit)
	}
	return data, nil
}

func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is %s, %w: plan inputs (plan files, -var-file, file()) must be regular files; replace it with one", path, fileKind(m), ErrNotRegular)
}

// fileKind names what a non-regular file is, for the refusal.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	case m.IsDir():
		return "a directory"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// addInput records path among the files the plan was loaded from (absolute, once).
func (p *Plan) addInput(path string) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	for _, have := range p.Inputs {
		if have == path {
			return
		}
	}
	p.Inputs = append(p.Inputs, path)
}
