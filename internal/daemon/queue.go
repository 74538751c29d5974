package daemon

import (
	"sync"
	"time"
)

// workQueue is controller-runtime's work queue, keyed by resource address: an address
// queued twice waits once (de-duplicated); an address is never handed to two workers at
// once, and one queued again while a worker has it is handed out again after Done, so a
// change seen during a reconcile is never lost. AddAfter is each address's own timer
// (its resync, or the end of its backoff): the latest call wins.
type workQueue struct {
	mu         sync.Mutex
	cond       *sync.Cond
	items      []string
	dirty      map[string]bool // queued (waiting, or to re-run after the worker's Done)
	processing map[string]bool
	timers     map[string]*time.Timer
	down       bool
	// trace, when set, hears what each Add and AddAfter did (the --log-level debug
	// lines); it is called without the queue's lock.
	trace func(addr, what string, after time.Duration)
}

func newWorkQueue() *workQueue {
	q := &workQueue{dirty: map[string]bool{}, processing: map[string]bool{}, timers: map[string]*time.Timer{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add queues addr now.
func (q *workQueue) Add(addr string) {
	q.mu.Lock()
	what := q.add(addr)
	trace := q.trace
	q.mu.Unlock()
	if trace != nil && what != "" {
		trace(addr, what, 0)
	}
}

// add is Add under q.mu; it says what it did.
func (q *workQueue) add(addr string) string {
	switch {
	case q.down:
		return ""
	case q.dirty[addr]:
		return "already queued"
	}
	q.dirty[addr] = true
	if q.processing[addr] {
		return "queued again: once its reconcile in flight ends" // after Done
	}
	q.items = append(q.items, addr)
	q.cond.Signal()
	return "queued"
}

// AddAfter queues addr after d, replacing its earlier timer.
func (q *workQueue) AddAfter(addr string, d time.Duration) {
	q.mu.Lock()
	if q.down {
		q.mu.Unlock()
		return
	}
	if t := q.timers[addr]; t != nil {
		t.Stop()
	}
	q.timers[addr] = time.AfterFunc(d, func() { q.Add(addr) })
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
	for len(q.items) == 0 && !q.down {
		q.cond.Wait()
	}
	if q.down {
		return "", false
	}
	addr, q.items = q.items[0], q.items[1:]
	delete(q.dirty, addr)
	q.processing[addr] = true
	return addr, true
}

// Done ends the processing of addr, queueing it again when it was added meanwhile.
func (q *workQueue) Done(addr string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, addr)
	if q.dirty[addr] && !q.down {
		q.items = append(q.items, addr)
		q.cond.Signal()
	}
}

// Len is the number of addresses waiting for a worker.
func (q *workQueue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
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
