package warm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The ledger's choice for a cold start follows what was measured on this filesystem:
// readers at the first, none at the next (to compare), then readers unless they measured
// slower by more than the noise. Starts that read too little are no figures; figures it
// cannot read count as none.
func TestLedgerKeepsTheReadersAwayWhereTheyMeasuredSlower(t *testing.T) {
	type start struct {
		beside  bool
		seconds float64
		cold    int64
	}
	const gib = 1 << 30
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		starts  []start
		want    bool
		wantWhy string
	}{
		{name: "nothing measured", want: true},
		{name: "with readers only", starts: []start{{true, 20, 2 * gib}}, want: false, wantWhy: "measuring one cold start without the readers on this filesystem, to compare (with them: 10.0 s/GiB)"},
		{name: "readers slower", starts: []start{{true, 23, 2 * gib}, {false, 20, 2 * gib}}, want: false, wantWhy: "on this filesystem cold starts measured slower with the readers beside (11.5 s/GiB against 10.0 without)"},
		{name: "readers faster", starts: []start{{true, 12, 2 * gib}, {false, 20, 2 * gib}}, want: true},
		{name: "within the noise", starts: []start{{true, 21, 2 * gib}, {false, 20, 2 * gib}}, want: true},
		{name: "too little read cold to count", starts: []start{{true, 20, MinColdBytes - 1}}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(t.TempDir())
			for _, s := range tc.starts {
				if err := l.Record("dev 8:3 /models/m", s.beside, s.seconds, s.cold, at); err != nil {
					t.Fatal(err)
				}
			}
			got, why := l.Beside("dev 8:3 /models/m")
			if got != tc.want || why != tc.wantWhy {
				t.Errorf("beside %v (%q), want %v (%q)", got, why, tc.want, tc.wantWhy)
			}
			if other, _ := l.Beside("dev 8:4 /models/m"); !other {
				t.Error("another filesystem's figures decided this one")
			}
		})
	}
	t.Run("unreadable figures", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, LedgerFile), []byte("{"), 0o644); err != nil {
			t.Fatal(err)
		}
		if ok, _ := NewLedger(dir).Beside("k"); !ok {
			t.Error("an unreadable ledger kept the readers away")
		}
		if err := NewLedger(dir).Record("k", true, 10, 1<<30, at); err != nil {
			t.Fatal(err)
		}
		if ok, why := NewLedger(dir).Beside("k"); ok || !strings.HasPrefix(why, "measuring") {
			t.Errorf("after a figure over an unreadable file: %v %q", ok, why)
		}
	})
}

// Key tells filesystems and models apart.
func TestKeyNamesTheDeviceAndDirectory(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "model.safetensors")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	k, err := Key([]string{f})
	if err != nil || !strings.HasPrefix(k, "dev ") || !strings.HasSuffix(k, " "+dir) {
		t.Errorf("key %q (%v)", k, err)
	}
	if _, err := Key(nil); err == nil {
		t.Error("a key for no files")
	}
}
