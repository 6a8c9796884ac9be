package metrics

import (
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/server"
)

// Deferred is an Observer that hands calls to another off the caller's
// path: ObserveCall queues the call and returns, and the queued calls are
// handed over together, on a goroutine of their own, a delay after the
// first of them was queued. An answer then no longer waits for the
// metrics and the page's counts, and the observers see calls in batches,
// their counters warm in one core's cache.
//
// Queued calls are handed over one at a time, in the order they were
// queued. Flush hands over every queued call at once: readers that must
// count every call answered before they began (a scrape, the /limits
// page) call it first. At most a bound of calls wait; a call that finds
// the queue full is handed over by its caller at once, as without
// Deferred, ahead of those queued and perhaps while a batch is being
// handed over (next must be safe for concurrent use, as every Observer
// is). The zero value is not usable; call NewDeferred. It is safe for
// concurrent use.
type Deferred struct {
	next  server.Observer
	delay time.Duration
	max   int
	timer *time.Timer

	mu     sync.Mutex
	queue  []server.Call
	spare  []server.Call // the last batch's slice, reused
	armed  bool          // the timer runs for the calls in queue
	closed bool

	// handing is held while a batch is handed over, so that Flush returns
	// only once every call queued before it has been.
	handing sync.Mutex
}

// Defaults of NewDeferred.
const (
	DefaultDeferDelay  = time.Millisecond
	DefaultMaxDeferred = 8192
)

// NewDeferred returns a Deferred handing calls to next after delay (at
// most about that long after they were queued), with at most max calls
// queued; a delay or max of 0 takes DefaultDeferDelay or
// DefaultMaxDeferred.
func NewDeferred(next server.Observer, delay time.Duration, max int) *Deferred {
	if delay <= 0 {
		delay = DefaultDeferDelay
	}
	if max <= 0 {
		max = DefaultMaxDeferred
	}
	d := &Deferred{next: next, delay: delay, max: max}
	d.timer = time.AfterFunc(time.Hour, d.hand)
	d.timer.Stop()
	return d
}

// ObserveCall queues c, or hands it over at once when the queue is full or
// after Close.
func (d *Deferred) ObserveCall(c server.Call) {
	d.mu.Lock()
	if d.closed || len(d.queue) >= d.max {
		d.mu.Unlock()
		d.next.ObserveCall(c)
		return
	}
	d.queue = append(d.queue, c)
	if !d.armed {
		d.armed = true
		d.timer.Reset(d.delay)
	}
	d.mu.Unlock()
}

// Flush hands over every call queued before it, and returns once they
// have been.
func (d *Deferred) Flush() { d.hand() }

// Close hands over the queued calls; later calls are handed over by their
// callers. It is safe to call more than once.
func (d *Deferred) Close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.timer.Stop()
	d.hand()
}

// hand hands the queued calls over, one batch at a time.
func (d *Deferred) hand() {
	d.handing.Lock()
	defer d.handing.Unlock()
	d.mu.Lock()
	batch := d.queue
	d.queue, d.spare = d.spare[:0], nil
	d.armed = false
	d.mu.Unlock()
	for i := range batch {
		d.next.ObserveCall(batch[i])
		batch[i] = server.Call{} // keeps no request alive
	}
	d.mu.Lock()
	d.spare = batch[:0]
	d.mu.Unlock()
}
