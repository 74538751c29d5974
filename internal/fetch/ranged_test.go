package fetch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/fetch/fetchtest"
)

const piece = 256 << 10 // PieceSize in the range tests

func rangedOptions(dest string) fetch.Options {
	o := testOptions(dest)
	o.PieceSize = piece
	o.Connections = 8
	return o
}

// TestRangesBeatAConnectionCap: a server that caps each connection at 1 MiB/s and delays
// the first byte serves a 4 MiB file over 8 connections at once, each byte once, and the
// file lands whole and verified in a fraction of the time one connection would take.
func TestRangesBeatAConnectionCap(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	data := content(4<<20, 50)
	f := add(s, "model.bin", data)
	s.SetFault("/model.bin", fetchtest.Fault{Rate: 1 << 20, FirstByteDelay: 20 * time.Millisecond})
	start := time.Now()
	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, rangedOptions(dest))
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	took := time.Since(start)
	wantFile(t, dest, "model.bin", data)
	st := s.Stats("/model.bin")
	t.Logf("took %v, stats %+v, result %+v", took, st, res.Files[0])
	if st.MaxInFlight < 8 {
		t.Errorf("at most %d requests at once, want 8 connections", st.MaxInFlight)
	}
	if st.BytesSent != int64(len(data)) {
		t.Errorf("server sent %d bytes for a %d-byte file: something was fetched twice", st.BytesSent, len(data))
	}
	if st.RangeGETs < len(data)/piece {
		t.Errorf("%d range GETs, want one per piece (%d)", st.RangeGETs, len(data)/piece)
	}
	// One connection would need 4 s; eight need about 0.5 s. Allow a loaded machine.
	if took > 3*time.Second {
		t.Errorf("took %v: the connections did not add up", took)
	}
}

// TestRangeFaults: each fault on the range path ends in a correct file or a clear error,
// never a wrong file in place, and within the bytes it may cost.
func TestRangeFaults(t *testing.T) {
	t.Parallel()
	const size = 2 << 20
	data := content(size, 60)
	next := content(size, 61)
	tests := []struct {
		name       string
		fault      fetchtest.Fault
		expect     []byte
		wantErr    error
		wantText   string
		maxRefetch int64 // bytes sent beyond one copy (-1: no bound)
		stall      time.Duration
		check      func(t *testing.T, st fetchtest.Stats, fr fetch.FileResult)
	}{
		// A dropped connection loses what sat in its socket buffers, which the server counted.
		{name: "connections dropped mid-range resume their range", fault: fetchtest.Fault{DropAfter: 100 << 10, Times: 6}, expect: data, maxRefetch: 6 * 100 << 10},
		{name: "ranges that end early are continued", fault: fetchtest.Fault{MaxRange: 100 << 10}, expect: data, maxRefetch: 0},
		{name: "close-delimited ranges cut short are continued", fault: fetchtest.Fault{EndCleanlyAfter: 50 << 10, Times: 5}, expect: data, maxRefetch: 0},
		{name: "wrong bytes once are fetched again", fault: fetchtest.Fault{Corrupt: true, Times: 1}, expect: data, maxRefetch: size},
		{name: "wrong bytes always fail", fault: fetchtest.Fault{Corrupt: true}, wantErr: fetch.ErrChecksum, maxRefetch: -1},
		{name: "a server that ignores ranges falls back to one stream", fault: fetchtest.Fault{IgnoreRange: true}, expect: data, maxRefetch: -1,
			check: func(t *testing.T, st fetchtest.Stats, fr fetch.FileResult) {
				// The answer to the first range requests (one per connection at most) is
				// cut off; then one stream.
				if st.BytesSent > 9*size {
					t.Errorf("sent %d bytes", st.BytesSent)
				}
			}},
		{name: "a changed file restarts from zero", fault: fetchtest.Fault{ChangeAfter: 3, Next: next}, expect: next, maxRefetch: -1,
			check: func(t *testing.T, st fetchtest.Stats, fr fetch.FileResult) {
				if fr.Restarts != 1 {
					t.Errorf("Restarts = %d, want 1", fr.Restarts)
				}
			}},
		{name: "gzip is refused", fault: fetchtest.Fault{Gzip: true}, wantErr: fetch.ErrCompressed, maxRefetch: -1},
		{name: "503 with Retry-After is waited for", fault: fetchtest.Fault{Busy: 3, RetryAfter: "1"}, expect: data, maxRefetch: 0,
			check: func(t *testing.T, st fetchtest.Stats, fr fetch.FileResult) {
				if st.Busy != 3 {
					t.Errorf("%d busy answers, want 3", st.Busy)
				}
			}},
		{name: "429 with Retry-After is waited for", fault: fetchtest.Fault{Busy: 2, BusyStatus: 429, RetryAfter: "1"}, expect: data, maxRefetch: 0},
		{name: "a stall is aborted and its range resumed", fault: fetchtest.Fault{Stall: time.Minute, StallAfter: 10 << 10, Times: 2}, expect: data, maxRefetch: -1,
			stall: 300 * time.Millisecond},
		// A signed URL good for 100 KiB: every connection re-resolves through the file's
		// URL many times, each attempt making progress, and the file finishes.
		{name: "signed URLs that expire are resolved again", fault: fetchtest.Fault{SignedBytes: 100 << 10}, expect: data, maxRefetch: 0,
			check: func(t *testing.T, st fetchtest.Stats, fr fetch.FileResult) {
				if st.Expired == 0 || st.Signed < 20 {
					t.Errorf("stats %+v: want expired signatures and fresh ones", st)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			f := add(s, "model.bin", data)
			if tc.expect != nil {
				f.SHA256 = sum(tc.expect)
			}
			s.SetFault("/model.bin", tc.fault)
			opts := rangedOptions(dest)
			if tc.stall > 0 {
				opts.StallTimeout = tc.stall
			}
			start := time.Now()
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
			took := time.Since(start)
			fr := res.Files[0]
			st := s.Stats("/model.bin")
			t.Logf("took %v, result %+v, stats %+v", took, fr, st)
			if tc.expect == nil {
				if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.wantText) {
					t.Fatalf("Fetch = %v, want %v", err, tc.wantErr)
				}
				wantAbsent(t, dest, "model.bin")
				return
			}
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", tc.expect)
			if refetch := st.BytesSent - int64(len(tc.expect)); tc.maxRefetch >= 0 && refetch > tc.maxRefetch {
				t.Errorf("sent %d bytes beyond one copy, want at most %d", refetch, tc.maxRefetch)
			}
			if tc.fault.RetryAfter != "" && took < time.Second {
				t.Errorf("took %v: Retry-After: %s was not honoured", took, tc.fault.RetryAfter)
			}
			if tc.check != nil {
				tc.check(t, st, fr)
			}
		})
	}
}

const (
	killSize        = 8 << 20
	killConnections = 10
	killCheckpoint  = 64 << 10
)

// TestKillWithRangesInFlight kills a process fetching one file over 10 connections with
// SIGKILL, several times, each time once 8 ranges or more are in flight (every connection
// runs to a random offset of its range, where the server holds it) and after a random
// delay, then resumes: within one boot nothing the helper wrote is fetched twice. A kill
// followed by a simulated reboot (a live record of another boot) costs at most one
// checkpoint per connection.
//
// The server counts the bytes it sent, not those the helper read (NOTES): what sat in socket
// buffers or in a read buffer not yet written when the helper died is lost and must be
// fetched again. After each kill the test measures that loss exactly, as the bytes sent less
// the bytes the dead helper's live record (through Check) says it wrote, and the bytes
// fetched twice must equal the sum of those losses.
func TestKillWithRangesInFlight(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data := content(killSize, 70)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	// kill runs a helper until 8 ranges or more are in flight, waits a random 0–30 ms,
	// SIGKILLs it, and returns the bytes sent so far that no helper wrote.
	//
	// With minWritten > 0 the connections are capped at 256 KiB/s instead of held, and the
	// kill waits until the helper wrote minWritten bytes.
	//
	// *stops holds each piece's stall offset from the round before (empty: none yet): a
	// new one is drawn past it, so that what earlier rounds wrote never lies beyond every
	// new stall (stalls drawn afresh each round once left fewer than 8 pieces that could
	// stall in round 4).
	kill := func(t *testing.T, rng *rand.Rand, s *fetchtest.Server, f fetch.File, dest string, round int, minWritten int64, stops *[]int64) (lost, written int64) {
		for i, p := 0, int64(0); p < killSize; i, p = i+1, p+piece {
			if i == len(*stops) {
				*stops = append(*stops, p)
			}
			if left := p + piece - (*stops)[i]; left > 1 {
				(*stops)[i] += 1 + rng.Int64N(left-1)
			}
		}
		fault := fetchtest.Fault{StallAt: slices.Clone(*stops)}
		if minWritten > 0 {
			// Paced, and held in the last quarter so the helper cannot finish first.
			fault = fetchtest.Fault{Rate: 256 << 10, StallAt: []int64{killSize * 3 / 4}}
		}
		s.SetFault("/model.bin", fault)
		cmd := exec(t, exe, "-test.run=^$", "FETCH_HELPER_URL="+f.URL, "FETCH_HELPER_SHA="+f.SHA256,
			"FETCH_HELPER_DEST="+dest, "FETCH_HELPER_RANGED=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for s.Stats("/model.bin").InFlight < 8 || (minWritten > 0 && partial(t, dest, f) < minWritten) {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: the helper never had 8 ranges in flight (stats %+v)", round, s.Stats("/model.bin"))
			}
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(time.Duration(rng.Int64N(int64(30 * time.Millisecond))))
		inFlight := s.Stats("/model.bin").InFlight
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		// The server's handlers notice the closed connections and stop sending.
		for s.Stats("/model.bin").InFlight > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: responses still in flight after the kill", round)
			}
			time.Sleep(2 * time.Millisecond)
		}
		res, err := fetch.Check(t.Context(), dest, []fetch.File{f})
		if err != nil {
			t.Fatal(err)
		}
		sent := s.Stats("/model.bin").BytesSent
		// Both counts run over every helper so far: their difference is all that was lost.
		lost, written = sent-res.Files[0].Partial, res.Files[0].Partial
		t.Logf("round %d: SIGKILL with %d ranges in flight; %d bytes sent in all, %d written, %d lost in buffers so far",
			round, inFlight, sent, written, lost)
		return lost, written
	}

	t.Run("same boot", func(t *testing.T) {
		t.Parallel()
		s := serve(t)
		dest := t.TempDir()
		f := add(s, "model.bin", data)
		rng := rand.New(rand.NewPCG(seed, 1))
		var lost int64
		var stops []int64
		for round := 1; round <= 4; round++ {
			lost, _ = kill(t, rng, s, f, dest, round, 0, &stops)
		}
		s.SetFault("/model.bin", fetchtest.Fault{})
		res, err := fetch.Fetch(t.Context(), []fetch.File{f}, rangedOptions(dest))
		if err != nil {
			t.Fatalf("resumed Fetch: %v", err)
		}
		wantFile(t, dest, "model.bin", data)
		st := s.Stats("/model.bin")
		twice := st.BytesSent - killSize
		t.Logf("after 4 kills: resumed from %d, %d bytes fetched twice, %d of them lost in buffers at the kills", res.Files[0].ResumedFrom, twice, lost)
		if twice != lost {
			t.Errorf("%d bytes fetched twice, want exactly the %d lost unwritten at the kills: written bytes were fetched again", twice, lost)
		}
	})
	t.Run("after a reboot", func(t *testing.T) {
		t.Parallel()
		s := serve(t)
		dest := t.TempDir()
		f := add(s, "model.bin", data)
		lost, written := kill(t, rand.New(rand.NewPCG(seed, 2)), s, f, dest, 1, 4*killConnections*killCheckpoint, new([]int64))
		if err := fetch.SimulateReboot(dest, "model.bin"); err != nil {
			t.Fatal(err)
		}
		s.SetFault("/model.bin", fetchtest.Fault{})
		res, err := fetch.Fetch(t.Context(), []fetch.File{f}, rangedOptions(dest))
		if err != nil {
			t.Fatalf("resumed Fetch: %v", err)
		}
		wantFile(t, dest, "model.bin", data)
		st := s.Stats("/model.bin")
		twice := st.BytesSent - killSize
		t.Logf("after a kill and a reboot: resumed from %d, %d bytes fetched twice (%d lost in buffers)", res.Files[0].ResumedFrom, twice, lost)
		if res.Files[0].ResumedFrom == 0 {
			t.Errorf("%d bytes written before the kill, nothing resumed after the reboot: the durable checkpoints were lost", written)
		}
		// Each connection loses at most the bytes since its last checkpoint, and one more
		// checkpoint's worth if the agent died while a checkpoint was being synced (the
		// workers go on writing meanwhile).
		if limit := lost + 2*killConnections*killCheckpoint; twice > limit {
			t.Errorf("%d bytes fetched twice after a reboot, want at most %d: the %d lost in buffers plus two checkpoints per connection", twice, limit, lost)
		}
	})
}

// partial is what Check says the partial file of f holds.
func partial(t *testing.T, dest string, f fetch.File) int64 {
	t.Helper()
	res, err := fetch.Check(t.Context(), dest, []fetch.File{f})
	if err != nil {
		t.Fatal(err)
	}
	return res.Files[0].Partial
}

// TestExpiringSignedURLsOneStream: a 6 MiB file behind a Hub whose signed CDN URLs expire
// every 1 MiB, fetched as one stream (Connections = 1) with the default three retries,
// finishes in one Fetch: every attempt re-resolves through the file's URL and makes
// progress, which resets the budget. It used to give up after 4 attempts.
func TestExpiringSignedURLsOneStream(t *testing.T) {
	t.Parallel()
	s := serve(t)
	dest := t.TempDir()
	data := content(6<<20, 80)
	f := add(s, "model.bin", data)
	s.SetFault("/model.bin", fetchtest.Fault{SignedBytes: 1 << 20})
	opts := testOptions(dest)
	opts.Connections = 1
	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
	st := s.Stats("/model.bin")
	t.Logf("result %+v, stats %+v", res.Files[0], st)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	wantFile(t, dest, "model.bin", data)
	if res.Files[0].Attempts < 6 || st.Expired == 0 {
		t.Errorf("%d attempts, %d expired signatures: want one attempt per signed MiB", res.Files[0].Attempts, st.Expired)
	}
}

// TestRetryAfterOneStream: a 429 with Retry-After on the single-stream path is waited for,
// and a server that only ever answers 503 still runs out of attempts.
func TestRetryAfterOneStream(t *testing.T) {
	t.Parallel()
	s := serve(t)
	data := content(100<<10, 81)
	f := add(s, "model.bin", data)
	s.SetFault("/model.bin", fetchtest.Fault{Busy: 1, BusyStatus: 429, RetryAfter: "1"})
	opts := testOptions(t.TempDir())
	start := time.Now()
	if _, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts); err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("took %v: Retry-After: 1 was not honoured", took)
	}

	s.SetFault("/model.bin", fetchtest.Fault{Busy: 1000})
	_, err := fetch.Fetch(t.Context(), []fetch.File{f}, testOptions(t.TempDir()))
	var se *fetch.StatusError
	if !errors.As(err, &se) || se.Status != 503 || !strings.Contains(err.Error(), "giving up after 4 attempts") {
		t.Fatalf("Fetch = %v, want a 503 StatusError after 4 attempts", err)
	}
}

// TestSizeLearned: a file the plan gives no size for is sized from a HEAD or, when the
// server refuses HEAD or answers it without a length, from the Content-Range of a first
// ranged GET whose bytes are kept; then it is fetched over every connection like a file of
// declared size, each byte once. A size that changes under the download restarts the file.
func TestSizeLearned(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	data := content(size, 90)
	bigger := content(size+100<<10, 91)
	tests := []struct {
		name      string
		fault     fetchtest.Fault
		expect    []byte
		wantHEADs int
		restarts  int
	}{
		{name: "from HEAD", expect: data, wantHEADs: 1},
		{name: "HEAD refused: from the first range", fault: fetchtest.Fault{RefuseHEAD: true}, expect: data, wantHEADs: 1},
		{name: "HEAD without a length: from the first range", fault: fetchtest.Fault{HEADNoLength: true}, expect: data, wantHEADs: 1},
		{name: "HEAD busy: from the first range", fault: fetchtest.Fault{BusyHEAD: 1}, expect: data, wantHEADs: 1},
		// The fourth GET sees another file: its total no longer matches the learned size.
		{name: "a changed total restarts the file", fault: fetchtest.Fault{ChangeAfter: 3, Next: bigger}, expect: bigger, wantHEADs: 2, restarts: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			f := add(s, "model.bin", data)
			f.Size, f.SHA256 = -1, sum(tc.expect)
			fault := tc.fault
			fault.Rate, fault.FirstByteDelay = 1<<20, 20*time.Millisecond
			s.SetFault("/model.bin", fault)
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, rangedOptions(dest))
			st := s.Stats("/model.bin")
			t.Logf("result %+v, stats %+v", res.Files[0], st)
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", tc.expect)
			if st.MaxInFlight < 8 {
				t.Errorf("at most %d requests at once, want 8 connections: the size was not learned", st.MaxInFlight)
			}
			if st.HEADs != tc.wantHEADs {
				t.Errorf("%d HEAD requests, want %d", st.HEADs, tc.wantHEADs)
			}
			if res.Files[0].Restarts != tc.restarts {
				t.Errorf("Restarts = %d, want %d", res.Files[0].Restarts, tc.restarts)
			}
			if tc.restarts == 0 && st.BytesSent != size {
				t.Errorf("server sent %d bytes for a %d-byte file: the first range's bytes were not kept", st.BytesSent, size)
			}
			if res.Files[0].Size != int64(len(tc.expect)) {
				t.Errorf("result size %d, want %d", res.Files[0].Size, len(tc.expect))
			}
		})
	}
}

// TestSizeLearnedOneStream: without ranges (a 200 to the first range) or with nothing to
// share (an empty file), a file of unknown size still lands, on one stream.
func TestSizeLearnedOneStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		data  []byte
		fault fetchtest.Fault
	}{
		{"ignores ranges, HEAD refused", content(2<<20, 92), fetchtest.Fault{IgnoreRange: true, RefuseHEAD: true}},
		{"empty, HEAD refused", []byte{}, fetchtest.Fault{RefuseHEAD: true}},
		{"empty", []byte{}, fetchtest.Fault{}},
		{"smaller than a piece", content(100<<10, 93), fetchtest.Fault{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			f := add(s, "model.bin", tc.data)
			f.Size = -1
			s.SetFault("/model.bin", tc.fault)
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, rangedOptions(dest))
			t.Logf("result %+v, stats %+v", res.Files[0], s.Stats("/model.bin"))
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", tc.data)
		})
	}
}

// TestStraggler: one of 8 connections is congested at a thirty-second of the others' rate.
// Without work stealing the file waits for it: its 512 KiB piece alone takes 16 s. With it,
// once the congested connection has been judged on a second of its bytes, a faster
// connection splits its range and takes the rest, so the file finishes a second or so after
// the aggregate rate would, verified (the hasher follows the prefix across the split), with
// each byte fetched about once. With sizes learned, the same.
func TestStraggler(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	data := content(size, 95)
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("size known %v", known), func(t *testing.T) {
			t.Parallel()
			s := serve(t)
			dest := t.TempDir()
			f := add(s, "model.bin", data)
			if !known {
				f.Size = -1
			}
			s.SetFault("/model.bin", fetchtest.Fault{Rate: 1 << 20, Congested: 1, CongestedRate: 32 << 10})
			opts := rangedOptions(dest)
			opts.PieceSize = 512 << 10
			start := time.Now()
			res, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
			took := time.Since(start)
			st := s.Stats("/model.bin")
			t.Logf("took %v, result %+v, stats %+v", took, res.Files[0], st)
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			wantFile(t, dest, "model.bin", data)
			if st.CongestedGETs == 0 {
				t.Fatalf("no answer went through the congested connection: the test proves nothing")
			}
			if res.Files[0].Stolen == 0 {
				t.Errorf("no range was split off the congested connection")
			}
			// 8 MiB over 8 connections at 1 MiB/s is 1 s, plus the second that judges
			// the congested connection; alone it needs 16 s for its piece. Allow a
			// loaded machine.
			if took > 6*time.Second {
				t.Errorf("took %v: the congested connection held the file back", took)
			}
			// What the congested connection had in flight when its range was cut is sent
			// again at most once per split: a few of its paced 512-byte writes.
			if extra := st.BytesSent - size; extra > int64(res.Files[0].Stolen)*(64<<10) {
				t.Errorf("sent %d bytes beyond one copy for %d splits", extra, res.Files[0].Stolen)
			}
		})
	}
}

// TestFreeSpaceCheckedOnceLearned: a file of unknown size is checked against the free space
// once its size is learned, before a byte of it is fetched.
func TestFreeSpaceCheckedOnceLearned(t *testing.T) {
	t.Parallel()
	s := serve(t)
	f := add(s, "model.bin", content(4<<20, 96))
	f.Size = -1
	opts := rangedOptions(t.TempDir())
	opts.FreeSpaceMargin = 1 << 60 // no filesystem has this much free
	_, err := fetch.Fetch(t.Context(), []fetch.File{f}, opts)
	if !errors.Is(err, fetch.ErrNoSpace) {
		t.Fatalf("Fetch: %v, want ErrNoSpace", err)
	}
	if st := s.Stats("/model.bin"); st.GETs != 0 {
		t.Errorf("%d GETs though the space check failed (stats %+v)", st.GETs, st)
	}
}

// TestSizeLearnedResumes: a download of unknown size stopped halfway resumes from its
// sidecar, which keeps the learned size (no second HEAD), fetching nothing twice but what
// the stop cut off in flight; the first answer after the resume is checked against it.
func TestSizeLearnedResumes(t *testing.T) {
	t.Parallel()
	const size = 4 << 20
	s := serve(t)
	dest := t.TempDir()
	data := content(size, 97)
	f := add(s, "model.bin", data)
	f.Size = -1
	s.SetFault("/model.bin", fetchtest.Fault{Rate: 1 << 20})
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		for partial(t, dest, f) < size/4 {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	if _, err := fetch.Fetch(ctx, []fetch.File{f}, rangedOptions(dest)); !errors.Is(err, context.Canceled) {
		t.Fatalf("first Fetch = %v, want it cancelled", err)
	}
	kept := partial(t, dest, f)
	s.SetFault("/model.bin", fetchtest.Fault{})
	res, err := fetch.Fetch(t.Context(), []fetch.File{f}, rangedOptions(dest))
	st := s.Stats("/model.bin")
	t.Logf("kept %d, result %+v, stats %+v", kept, res.Files[0], st)
	if err != nil {
		t.Fatalf("resumed Fetch: %v", err)
	}
	wantFile(t, dest, "model.bin", data)
	if res.Files[0].ResumedFrom != kept || kept < size/4 {
		t.Errorf("resumed from %d, want the %d bytes kept", res.Files[0].ResumedFrom, kept)
	}
	if st.HEADs != 1 {
		t.Errorf("%d HEADs: the resume did not take the learned size from the sidecar", st.HEADs)
	}
	// What the cancel cut off in the 8 connections' buffers is fetched again; nothing kept.
	if twice := st.BytesSent - size; twice > 8*(64<<10) {
		t.Errorf("%d bytes fetched twice", twice)
	}
}
