package warm

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// window is how much of a file one mincore call looks at (its vector: a byte per page).
const window = 1 << 30

// Missing returns f's size and the ranges of it ([offset, length], in page units,
// the last one cut at the size) whose pages are not in the page cache. It maps f
// read-only to ask mincore and never reads the mapping.
func Missing(f *os.File) (size int64, missing [][2]int64, err error) {
	st, err := f.Stat()
	if err != nil {
		return 0, nil, err
	}
	size = st.Size()
	if size == 0 {
		return 0, nil, nil
	}
	page := int64(os.Getpagesize())
	vec := make([]byte, window/page)
	for base := int64(0); base < size; base += window {
		n := min(window, size-base)
		m, err := unix.Mmap(int(f.Fd()), base, int(n), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return size, nil, fmt.Errorf("mmap: %w", err)
		}
		pages := (n + page - 1) / page
		err = mincore(m, vec[:pages])
		unix.Munmap(m)
		if err != nil {
			return size, nil, fmt.Errorf("mincore: %w", err)
		}
		for i := int64(0); i < pages; i++ {
			if vec[i]&1 != 0 {
				continue
			}
			off := base + i*page
			l := min(page, size-off)
			if k := len(missing) - 1; k >= 0 && missing[k][0]+missing[k][1] == off {
				missing[k][1] += l
			} else {
				missing = append(missing, [2]int64{off, l})
			}
		}
	}
	return size, missing, nil
}

// mincore fills vec with a byte per page of m whose lowest bit says it is resident.
func mincore(m, vec []byte) error {
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return e
	}
	return nil
}

// Resident is how many of the file's bytes are in the page cache.
func Resident(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	size, missing, err := Missing(f)
	for _, m := range missing {
		size -= m[1]
	}
	return size, err
}

// Evict asks the kernel to drop the file's clean pages from the page cache
// (posix_fadvise DONTNEED); dirty pages are written first.
func Evict(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("evict %s: fdatasync: %w", path, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("evict %s: fadvise: %w", path, err)
	}
	return nil
}

// MemAvailable is /proc/meminfo's MemAvailable under root, in bytes.
func MemAvailable(root string) (int64, error) {
	p := filepath.Join("/", root, "proc/meminfo")
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("the available memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: MemAvailable %q: %w", p, rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return 0, fmt.Errorf("%s has no MemAvailable line", p)
}
