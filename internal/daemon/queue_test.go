package daemon

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// The work queue's promises: an address queued twice waits once; an address is never
// handed to two workers at once; one queued again while a worker has it comes back after
// Done, once; AddAfter's latest call wins; ShutDown releases the workers.
func TestWorkQueue(t *testing.T) {
	t.Parallel()
	q := newWorkQueue()
	q.Add("a")
	q.Add("a")
	q.Add("b")
	if n := q.Len(); n != 2 {
		t.Fatalf("Len = %d after a, a, b; want 2", n)
	}
	a, _ := q.Get()
	if a != "a" {
		t.Fatalf("Get = %q, want a (first in)", a)
	}
	q.Add("a") // while a worker has it
	q.Add("a")
	b, _ := q.Get()
	if b != "b" || q.Len() != 0 {
		t.Fatalf("Get = %q with %d left; want b and a held back while in flight", b, q.Len())
	}
	q.Done(b)
	q.Done(a)
	if n := q.Len(); n != 1 {
		t.Fatalf("Len = %d after Done; want a once more", n)
	}
	if a2, _ := q.Get(); a2 != "a" {
		t.Fatalf("Get = %q, want a again", a2)
	}
	q.Done("a")

	// The latest AddAfter wins.
	q.AddAfter("c", time.Hour)
	q.AddAfter("c", 10*time.Millisecond)
	got := make(chan string, 1)
	go func() { s, _ := q.Get(); got <- s }()
	select {
	case s := <-got:
		if s != "c" {
			t.Fatalf("Get = %q, want c", s)
		}
		q.Done(s)
	case <-time.After(10 * time.Second):
		t.Fatal("the later, shorter AddAfter did not win")
	}

	// Many workers, many adds: never two workers on one address.
	var mu sync.Mutex
	busy := map[string]bool{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				s, ok := q.Get()
				if !ok {
					return
				}
				mu.Lock()
				if busy[s] {
					t.Errorf("%s handed to two workers at once", s)
				}
				busy[s] = true
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				busy[s] = false
				mu.Unlock()
				q.Done(s)
			}
		}()
	}
	for i := range 400 {
		q.Add([]string{"x", "y", "z"}[i%3])
	}
	time.Sleep(50 * time.Millisecond)
	q.ShutDown()
	wg.Wait()
}

// A death a watch noticed jumps the queue (issue 27): AddFirst goes before every routine
// turn already in line, moves an address already in line to the front (handed out
// once), and one added while in flight comes back first after Done.
func TestWorkQueueAddFirstJumpsTheLine(t *testing.T) {
	t.Parallel()
	q := newWorkQueue()
	for i := range 1000 {
		q.Add(fmt.Sprintf("r%d", i))
	}
	q.AddFirst("dead")
	q.AddFirst("r500") // in line already: moved up, not duplicated
	if n := q.Len(); n != 1001 {
		t.Fatalf("Len = %d, want 1001", n)
	}
	for _, want := range []string{"dead", "r500", "r0"} {
		if got, _ := q.Get(); got != want {
			t.Fatalf("Get = %q, want %q", got, want)
		}
		q.Done(want)
	}
	seen := map[string]int{}
	for q.Len() > 0 {
		a, _ := q.Get()
		seen[a]++
		if a == "r1" {
			q.AddFirst("r1") // noticed dying while in flight
			q.Add("r2")      // in line already
		}
		q.Done(a)
		if a == "r1" {
			if again, _ := q.Get(); again != "r1" {
				t.Fatalf("after Done, Get = %q, want r1 again first", again)
			}
			q.Done("r1")
		}
	}
	if seen["r500"] != 0 || seen["r2"] != 1 || len(seen) != 998 {
		t.Errorf("handed out: r500 %d times, r2 %d times, %d addresses; want 0, 1, 998", seen["r500"], seen["r2"], len(seen))
	}
}
