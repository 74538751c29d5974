package daemon

import (
	"sync"
	"time"
)

// workQueue is controller-runtime's work queue, keyed by resource address: an address
// queued twice waits once (de-duplicated); an address is never handed to two workers at
// once, and one queued again while a worker has it is handed out again after Done, so a
// change seen during a reconcile is never lost. AddAfter is each address's own timer
// (its resync, or the end of its backoff): the latest call wins. AddFirst jumps the
// queue: a death a watch noticed is repaired before thousands of routine turns (issue
// 27: a killed server waited behind 2,000 queued resources).
type workQueue struct {
	mu   sync.Mutex
	cond *sync.Cond
	// first and items are the addresses in line, urgent ones first. An address moved to
	// first stays in items too: an entry is handed out only while its address is
	// queued and not in flight, so the stale copy is skipped (lazy deletion).
	first, items []string
	waiting      int             // addresses queued and not in flight: Len
	dirty        map[string]bool // queued (waiting, or to re-run after the worker's Done)
	processing   map[string]bool
	firstAgain   map[string]bool // queued urgently while in flight: first after Done
	timers       map[string]*time.Timer
	down         bool
	// trace, when set, hears what each Add and AddAfter did (the --log-level debug
	// lines); it is called without the queue's lock.
	trace func(addr, what string, after time.Duration)
}

func newWorkQueue() *workQueue {
	q := &workQueue{dirty: map[string]bool{}, processing: map[string]bool{}, firstAgain: map[string]bool{}, timers: map[string]*time.Timer{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add queues addr now, at the end of the line.
func (q *workQueue) Add(addr string) { q.enqueue(addr, false) }

// AddFirst queues addr now, ahead of every routine turn (a death a watch noticed); when
// it is already in line, it moves to the front.
func (q *workQueue) AddFirst(addr string) { q.enqueue(addr, true) }

func (q *workQueue) enqueue(addr string, urgent bool) {
	q.mu.Lock()
	what := q.add(addr, urgent)
	trace := q.trace
	q.mu.Unlock()
	if trace != nil && what != "" {
		trace(addr, what, 0)
	}
}

// add is Add (urgent: AddFirst) under q.mu; it says what it did.
func (q *workQueue) add(addr string, urgent bool) string {
	switch {
	case q.down:
		return ""
	case q.dirty[addr] && urgent && !q.processing[addr]:
		q.first = append(q.first, addr) // its copy in items is skipped
		return "already queued; moved to the front"
	case q.dirty[addr]:
		if urgent && q.processing[addr] {
			q.firstAgain[addr] = true
		}
		return "already queued"
	}
	q.dirty[addr] = true
	if q.processing[addr] {
		if urgent {
			q.firstAgain[addr] = true
		}
		return "queued again: once its reconcile in flight ends" // after Done
	}
	q.waiting++
	if urgent {
		q.first = append(q.first, addr)
	} else {
		q.items = append(q.items, addr)
	}
	q.cond.Signal()
	return "queued"
}

// AddAfter queues addr after d, replacing its earlier timer.
func (q *workQueue) AddAfter(addr string, d time.Duration) { q.addAfter(addr, d, false) }

// AddFirstAfter is AddAfter whose turn, when due, jumps the queue (AddFirst).
func (q *workQueue) AddFirstAfter(addr string, d time.Duration) { q.addAfter(addr, d, true) }

func (q *workQueue) addAfter(addr string, d time.Duration, urgent bool) {
	if urgent && d <= 0 {
		q.AddFirst(addr)
		return
	}
	q.mu.Lock()
	if q.down {
		q.mu.Unlock()
		return
	}
	if t := q.timers[addr]; t != nil {
		t.Stop()
	}
	q.timers[addr] = time.AfterFunc(d, func() { q.enqueue(addr, urgent) })
	trace := q.trace
	q.mu.Unlock()
	if trace != nil {
		trace(addr, "next reconcile scheduled", d)
	}
}

// Forget stops addr's timer (the resource left the plan).
func (q *workQueue) Forget(addr string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.timers[addr]; t != nil {
		t.Stop()
		delete(q.timers, addr)
	}
}

// Get waits for an address to process; ok is false once the queue is shut down.
func (q *workQueue) Get() (addr string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		for q.waiting == 0 && !q.down {
			q.cond.Wait()
		}
		if q.down {
			return "", false
		}
		var addr string
		if len(q.first) > 0 {
			addr, q.first = q.first[0], q.first[1:]
		} else {
			addr, q.items = q.items[0], q.items[1:]
		}
		if !q.dirty[addr] || q.processing[addr] {
			continue // a stale copy: handed out already from the other line
		}
		delete(q.dirty, addr)
		q.processing[addr] = true
		q.waiting--
		return addr, true
	}
}

// Done ends the processing of addr, queueing it again when it was added meanwhile.
func (q *workQueue) Done(addr string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, addr)
	again := q.firstAgain[addr]
	delete(q.firstAgain, addr)
	if q.dirty[addr] && !q.down {
		if again {
			q.first = append(q.first, addr)
		} else {
			q.items = append(q.items, addr)
		}
		q.waiting++
		q.cond.Signal()
	}
}

// Len is the number of addresses waiting for a worker.
func (q *workQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiting
}

// ShutDown stops handing out work and stops every timer; workers' Get returns false.
func (q *workQueue) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.down = true
	for _, t := range q.timers {
		t.Stop()
	}
	q.cond.Broadcast()
}
