package state

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The key is made once, 0600, and read back the same; an applied plan is remembered
// with its outcome.
func TestPlanKeyAndAppliedPlans(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k1, err := s.PlanKey()
	if err != nil {
		t.Fatal(err)
	}
	k2, err := s.PlanKey()
	if err != nil || !bytes.Equal(k1, k2) || len(k1) != 32 {
		t.Fatalf("second key %x (%v), want the first %x", k2, err, k1)
	}
	if st, err := os.Stat(filepath.Join(s.Dir(), planKeyFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v, want mode 0600", st, err)
	}
	id := "0123456789abcdef0123456789abcdef"
	if m, err := s.AppliedPlans(); err != nil || len(m) != 0 {
		t.Fatalf("applied plans of a new state dir: %v %v", m, err)
	}
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	if err := s.RecordAppliedPlan(id, AppliedPlan{File: "/tmp/x.plan", At: at, Outcome: "started"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordAppliedPlan(id, AppliedPlan{File: "/tmp/x.plan", At: at, Outcome: "applied"}); err != nil {
		t.Fatal(err)
	}
	m, err := s.AppliedPlans()
	if err != nil || m[id].Outcome != "applied" || !m[id].At.Equal(at) || len(m) != 1 {
		t.Fatalf("applied plans: %v %v", m, err)
	}
	if err := s.RecordAppliedPlan("../x", AppliedPlan{}); err == nil {
		t.Error("a malformed id was recorded")
	}
}
