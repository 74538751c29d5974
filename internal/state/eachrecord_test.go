package state

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The cross-kind questions read the other records of a kind through EachRecord: never
// the asker's own, a record that cannot be read passed over, and "I do not know" (false)
// when there is no view to list.
func TestEachRecordReadsTheOthersOfAKind(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	type rec struct{ PID int }
	for addr, pid := range map[string]int{"server.a": 1, "server.b": 2, "server.c": 3, "container.x": 9} {
		if err := s.Save(addr, rec{PID: pid}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.path("server.c")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	ok := EachRecord(s.For("server.a").Others(), "server", func(addr string, r rec) bool {
		seen[addr] = r.PID
		return true
	})
	if want := map[string]int{"server.b": 2}; !ok || !reflect.DeepEqual(seen, want) {
		t.Errorf("EachRecord = %v, %v; want %v, true (own record and the unreadable one passed over)", seen, ok, want)
	}
	n := 0
	EachRecord(s.View(), "server", func(string, rec) bool { n++; return false })
	if n != 1 {
		t.Errorf("fn called %d times after it returned false, want 1", n)
	}
	var none *Scoped
	if EachRecord(none.Others(), "server", func(string, rec) bool { return true }) {
		t.Error("EachRecord over no state reported true, want false: the caller must take the safe answer")
	}
	dir := filepath.Dir(p) // the records' directory, made unlistable
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if EachRecord(s.View(), "server", func(string, rec) bool { return true }) {
		t.Error("EachRecord over an unlistable store reported true, want false")
	}
}
