package daemon

import (
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
