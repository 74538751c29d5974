package state

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary act as a second agent that takes the lock and then waits
// to be killed, so the tests can use a real separate process.
func TestMain(m *testing.M) {
	if dir := os.Getenv("STATE_TEST_HOLD_LOCK"); dir != "" {
		s, err := Open(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if _, err := s.Acquire(context.Background(), 0, "agent apply held.hcl"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("locked")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestStoreRoundTrip(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(dir)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode = %v, want 0700", st.Mode().Perm())
	}
	type rec struct {
		PID        int    `json:"pid"`
		Generation int    `json:"generation"`
		Log        string `json:"log"`
	}
	var got rec
	if ok, err := s.Load("server.qwen", &got); ok || err != nil {
		t.Fatalf("Load before Save = %v, %v", ok, err)
	}
	want := rec{PID: 42, Generation: 7, Log: "/var/log/agent/qwen.7.log"}
	if err := s.For("server.qwen").Save(want); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.For("server.qwen").Load(&got); !ok || err != nil || got != want {
		t.Fatalf("Load = %+v, %v, %v; want %+v", got, ok, err, want)
	}
	fi, err := os.Stat(filepath.Join(dir, "resources", "server.qwen.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	if err := s.Delete("server.qwen"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Load("server.qwen", &got); ok {
		t.Error("record survived Delete")
	}
}

func TestStoreTightensLooseDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(dir)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("mode = %v, want 0700", st.Mode().Perm())
	}
}

func TestStoreRejectsBadAddressAndCorruptFile(t *testing.T) {
	t.Parallel()
	s, _ := Open(t.TempDir())
	if err := s.Save("../escape", 1); err == nil {
		t.Error("Save accepted a path as an address")
	}
	os.WriteFile(filepath.Join(s.Dir(), "resources", "file.x.json"), []byte("{half"), 0o600)
	var v map[string]any
	if _, err := s.Load("file.x", &v); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("Load of a corrupt file = %v, want a corrupt-state error", err)
	}
}

func TestLockExcludesSecondAgent(t *testing.T) {
	t.Parallel()
	s, _ := Open(t.TempDir())
	l1, err := s.Acquire(context.Background(), 0, "agent apply a.hcl")
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Acquire(context.Background(), 0, "agent plan a.hcl")
	var locked *LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("second Acquire = %v, want LockedError", err)
	}
	if locked.Holder.PID != os.Getpid() || !strings.Contains(err.Error(), fmt.Sprintf("locked by PID %d since", os.Getpid())) {
		t.Errorf("error = %q, want it to name PID %d", err, os.Getpid())
	}
	// A waiter with a timeout gets the lock once the holder releases it.
	go func() {
		time.Sleep(150 * time.Millisecond)
		l1.Release()
	}()
	l2, err := s.Acquire(context.Background(), 10*time.Second, "agent plan a.hcl")
	if err != nil {
		t.Fatalf("Acquire with timeout after release: %v", err)
	}
	l2.Release()
}

func TestLockTimeoutExpires(t *testing.T) {
	t.Parallel()
	s, _ := Open(t.TempDir())
	l, _ := s.Acquire(context.Background(), 0, "holder")
	defer l.Release()
	_, err := s.Acquire(context.Background(), 200*time.Millisecond, "waiter")
	var locked *LockedError
	if !errors.As(err, &locked) {
		t.Fatalf("err = %v, want LockedError after the timeout", err)
	}
}

func TestLockOfKilledProcessIsTakenOver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, _ := Open(dir)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STATE_TEST_HOLD_LOCK="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, _ := out.Read(buf)
	if !strings.Contains(string(buf[:n]), "locked") {
		t.Fatalf("helper did not take the lock: %q", buf[:n])
	}
	_, err := s.Acquire(context.Background(), 0, "agent apply")
	var locked *LockedError
	if !errors.As(err, &locked) || locked.Holder.PID != cmd.Process.Pid || locked.Holder.Command != "agent apply held.hcl" {
		t.Fatalf("Acquire while the helper holds it = %v, want LockedError naming PID %d", err, cmd.Process.Pid)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	l, err := s.Acquire(context.Background(), 5*time.Second, "agent apply")
	if err != nil {
		t.Fatalf("lock of a killed holder was not taken over: %v", err)
	}
	l.Release()
}
