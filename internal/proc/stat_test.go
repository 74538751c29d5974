package proc

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// tail is fields 7..52 of a real stat line; only their count matters.
const tail = "0 -1 4194560 24963 0 0 0 141 356 0 0 20 0 1 0 80921 3133440 394 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0"

func TestParseStat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want Stat
		err  bool
	}{
		{
			name: "plain",
			in:   "9550 (cat) R 9544 9544 4233 " + tail,
			want: Stat{PID: 9550, Comm: "cat", State: 'R', PPID: 9544, PGRP: 9544, Session: 4233, StartTicks: 80921},
		},
		{
			name: "comm with spaces and parentheses",
			in:   "42 (a) b (c) d) S 1 42 42 " + tail,
			want: Stat{PID: 42, Comm: "a) b (c) d", State: 'S', PPID: 1, PGRP: 42, Session: 42, StartTicks: 80921},
		},
		{
			name: "comm that fakes the following fields",
			in:   "7 (x) R 1 1 1 0) Z 3 4 5 " + tail,
			want: Stat{PID: 7, Comm: "x) R 1 1 1 0", State: 'Z', PPID: 3, PGRP: 4, Session: 5, StartTicks: 80921},
		},
		{
			name: "empty comm",
			in:   "8 () S 0 0 0 " + tail,
			want: Stat{PID: 8, State: 'S', StartTicks: 80921},
		},
		{
			name: "trailing newline and huge starttime",
			in:   "1 (init) S 0 0 0 " + strings.Replace(tail, "80921", "18446744073709551615", 1) + "\n",
			want: Stat{PID: 1, Comm: "init", State: 'S', StartTicks: 18446744073709551615},
		},
		{
			// An exiting process whose group and session are already released: seen as
			// "-1" on this CI's kernel; one such line must not fail a whole listing.
			name: "exiting: no group or session",
			in:   "77 (python3) Z 1 -1 -1 " + tail,
			want: Stat{PID: 77, Comm: "python3", State: 'Z', PPID: 1, PGRP: 0, Session: 0, StartTicks: 80921},
		},
		{name: "empty", in: "", err: true},
		{name: "other negative group", in: "1 (init) S 0 -2 0 " + tail, err: true},
		{name: "no parentheses", in: "1 init S 0 0 0 " + tail, err: true},
		{name: "close before open", in: "1 )init( S 0 0 0 " + tail, err: true},
		{name: "short line", in: "1 (init) S 0 0 0 0 -1", err: true},
		{name: "one field short", in: "1 (init) S 0 0 0 " + tail[:strings.Index(tail, " 80921")], err: true},
		{name: "bad pid", in: "x1 (init) S 0 0 0 " + tail, err: true},
		{name: "negative pid", in: "-1 (init) S 0 0 0 " + tail, err: true},
		{name: "no pid", in: "(init) S 0 0 0 " + tail, err: true},
		{name: "state not a letter", in: "1 (init) 1 0 0 0 " + tail, err: true},
		{name: "long state", in: "1 (init) SS 0 0 0 " + tail, err: true},
		{name: "bad ppid", in: "1 (init) S z 0 0 " + tail, err: true},
		{name: "bad starttime", in: "1 (init) S 0 0 0 " + strings.Replace(tail, "80921", "-5", 1), err: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseStat([]byte(tt.in))
			if tt.err {
				if !errors.Is(err, ErrBadStat) {
					t.Fatalf("ParseStat(%q) = %+v, %v; want error wrapping ErrBadStat", tt.in, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseStat(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseStat(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

// FuzzParseStat proves ParseStat never panics, and that what it accepts is
// consistent: the comm it returns is exactly the text between the first
// '(' and the last ')'.
func FuzzParseStat(f *testing.F) {
	f.Add([]byte("9550 (cat) R 9544 9544 4233 " + tail))
	f.Add([]byte("42 (a) b (c) d) S 1 42 42 " + tail))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseStat(b)
		if err != nil {
			if !errors.Is(err, ErrBadStat) {
				t.Fatalf("error %v does not wrap ErrBadStat", err)
			}
			return
		}
		in := string(b)
		want := in[strings.IndexByte(in, '(')+1 : strings.LastIndexByte(in, ')')]
		if s.Comm != want {
			t.Fatalf("comm %q, want %q", s.Comm, want)
		}
		if s.PID < 0 || s.PPID < 0 || s.PGRP < 0 || s.Session < 0 || !isLetter(s.State) {
			t.Fatalf("accepted impossible stat %+v", s)
		}
	})
}
