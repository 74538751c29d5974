package warm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// coldFile writes size bytes to a file under dir (on disk: a tmpfs never evicts) and
// drops its pages from the page cache.
func coldFile(t *testing.T, dir, name string, size int) string {
	t.Helper()
	p := filepath.Join(dir, name)
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Evict(p); err != nil {
		t.Fatal(err)
	}
	if r, err := Resident(p); err != nil || r != 0 {
		t.Fatalf("after the eviction %d bytes of %s are resident (%v); the test needs a disk filesystem", r, p, err)
	}
	return p
}

func TestHalfResidentFileReadsOnlyItsOtherHalf(t *testing.T) {
	const size = 64 << 20
	p := coldFile(t, t.TempDir(), "model-00001-of-00001.safetensors", size)
	// Read the second half: readahead goes forward, so it cannot bring in the first.
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for off := int64(size / 2); off < size; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	// This machine's page cache loses a page now and then with memory to spare (a
	// VM's reclaim): a few pages of slack where the test waits on the kernel.
	const slack = 1 << 20
	before, err := Resident(p)
	if err != nil || before > size/2 || before < size/2-slack {
		t.Fatalf("half-resident file: %d bytes resident, want %d (%v)", before, size/2, err)
	}

	var mu sync.Mutex
	var calls int
	var last, lastNeed int64
	progress := func(read, need int64) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		last, lastNeed = max(last, read), need
	}
	res, err := Warm(context.Background(), []string{p}, Options{Block: 4 << 20, Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	if calls < 8 || last != res.Read || lastNeed != size-res.ResidentBefore {
		t.Errorf("progress heard %d times, last %d of %d; want a call per 4 MiB block, ending at %d of %d", calls, last, lastNeed, res.Read, size-res.ResidentBefore)
	}
	if res.ResidentBefore < before-slack || res.ResidentBefore > before || res.Read != size-res.ResidentBefore {
		t.Errorf("warm-up of a half-resident file (%d bytes resident) read %d bytes, counted %d resident before; want only the other half read", before, res.Read, res.ResidentBefore)
	}
	if res.Files != 1 || res.Bytes != size || !res.IdleIO || res.Skipped != "" {
		t.Errorf("warm-up: %+v", res)
	}
	if after, err := Resident(p); err != nil || after < size-slack {
		t.Errorf("after the warm-up %d of %d bytes are resident (%v)", after, size, err)
	}

	again, err := Warm(context.Background(), []string{p}, Options{})
	if err != nil || again.Read > size/100 || again.ResidentBefore < size-slack {
		t.Errorf("warm-up of warm weights: %+v, %v; want under 1 %% read", again, err)
	}
}

func TestTooLargeForMemoryIsSkippedWithTheReason(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	meminfo := "MemTotal:       24683748 kB\nMemFree:          102400 kB\nMemAvailable:     40960 kB\n"
	if err := os.WriteFile(filepath.Join(root, "proc/meminfo"), []byte(meminfo), 0o644); err != nil {
		t.Fatal(err)
	}
	p := coldFile(t, t.TempDir(), "model.safetensors", 48<<20)

	res, err := Warm(context.Background(), []string{p}, Options{Root: root, Margin: 4 << 20})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("warm-up of 48 MiB with 40 MiB available: %v, want ErrTooLarge", err)
	}
	// 90 % of 40 MiB less 4 MiB.
	for _, s := range []string{"48.0 MiB to read", "32.0 MiB allowed", "90 % of MemAvailable 40.0 MiB less the margin 4.0 MiB"} {
		if !strings.Contains(res.Skipped, s) || !strings.Contains(err.Error(), s) {
			t.Errorf("skipped reason %q (error %q) lacks %q", res.Skipped, err, s)
		}
	}
	if res.Read != 0 {
		t.Errorf("a skipped warm-up read %d bytes", res.Read)
	}
	if r, _ := Resident(p); r != 0 {
		t.Errorf("a skipped warm-up left %d bytes resident", r)
	}
	// Within the allowance it runs.
	if res, err := Warm(context.Background(), []string{p}, Options{Root: root, Margin: -1, Block: 1 << 20}); err == nil || res.Read != 0 {
		t.Errorf("48 MiB against 36 MiB: %+v, %v; want skipped", res, err)
	}
	small := coldFile(t, t.TempDir(), "small.bin", 8<<20)
	if res, err := Warm(context.Background(), []string{small}, Options{Root: root, Margin: 4 << 20}); err != nil || res.Read != 8<<20 {
		t.Errorf("8 MiB against 32 MiB: %+v, %v; want read", res, err)
	}
}

func TestVanishedFileFailsTheWarmUp(t *testing.T) {
	dir := t.TempDir()
	coldFile(t, dir, "a.safetensors", 4<<20)
	b := coldFile(t, dir, "b.safetensors", 4<<20)
	files, err := WeightFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	_, err = Warm(context.Background(), files, Options{})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), b) {
		t.Errorf("warm-up with %s gone: %v, want an error naming it", b, err)
	}
}

func TestEndedWarmUpSaysHowFarItGot(t *testing.T) {
	p := coldFile(t, t.TempDir(), "model.safetensors", 8<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Warm(ctx, []string{p}, Options{})
	if err == nil || !strings.Contains(err.Error(), "warm-up ended after") || res.Read == 8<<20 {
		t.Errorf("warm-up with its context ended: %+v, %v", res, err)
	}
}

func TestIdleIOClass(t *testing.T) {
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // the thread ends with this goroutine
		if err := SetIdleIO(); err != nil {
			done <- err
			return
		}
		c, err := IOClass()
		if err == nil && c != ioprioClassIdle {
			err = errors.New("not idle")
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c, err := IOClass(); err != nil || c == ioprioClassIdle {
		t.Errorf("the test's own thread is in class %d (%v): the idle class leaked", c, err)
	}
}

func TestWeightFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
		"model.safetensors.index.json", "config.json", "tokenizer.model", "README.md", ".cache/huggingface/x.bin", "draft/pytorch_model.bin", "draft/notes.txt"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gguf := filepath.Join(t.TempDir(), "q4.gguf")
	if err := os.WriteFile(gguf, []byte("GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := WeightFiles(dir, "Qwen/Qwen3-8B", "", gguf, filepath.Join(dir, "draft"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range []string{"config.json", "draft/pytorch_model.bin", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.model"} {
		want = append(want, filepath.Join(dir, f))
	}
	want = append(want, gguf)
	slices.Sort(want)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("weight files (-want +got):\n%s", d)
	}
}

// TestReaderThreadOutlivesItsWork: a reader's thread goes back to the runtime with its
// I/O class put back, never ended. A child forked from it with a parent death signal (as
// the test harnesses start incusd) lives on after the reader is done; when the threads
// ended with their readers, such an incusd shut down under unrelated tests.
func TestReaderThreadOutlivesItsWork(t *testing.T) {
	var child *exec.Cmd
	started := make(chan error, 1)
	go func() {
		// Off the main thread: the runtime never ends that one (it parks it instead).
		runtime.LockOSThread()
		for try := 0; syscall.Gettid() == os.Getpid(); try++ {
			runtime.UnlockOSThread()
			if try == 1000 {
				started <- errors.New("this goroutine never ran off the main thread")
				return
			}
			time.Sleep(time.Millisecond)
			runtime.LockOSThread()
		}
		defer runtime.UnlockOSThread()
		idle := onIdleThread(func() {
			if c, err := IOClass(); err != nil || c != ioprioClassIdle {
				started <- fmt.Errorf("inside: class %d (%v), want idle", c, err)
				return
			}
			child = exec.Command("sleep", "30")
			child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			started <- child.Start()
		})
		if !idle {
			t.Error("the idle class was not set")
		}
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = child.Wait(); close(exited) }()
	t.Cleanup(func() { child.Process.Kill(); <-exited })
	select {
	case <-exited:
		t.Fatalf("the child of a reader's thread ended with the reader (%v): the thread was ended", waitErr)
	case <-time.After(time.Second):
	}
}
