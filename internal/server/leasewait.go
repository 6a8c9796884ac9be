package server

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
)

// leaseQueues holds the requests of this process that wait for a slot of
// a concurrency limit (max_wait), first come first served per pool. Only
// the head of a queue asks the store; it asks when it joins an empty
// queue, when it becomes the head, when it is woken (a release here, or a
// message from the store that a release elsewhere freed a slot), and when
// the RetryAfter of its last denial has passed (the earliest lease's
// expiry, which publishes nothing; and a message can be lost). Across
// replicas waiting is not FIFO: each replica's head races for a freed slot.
type leaseQueues struct {
	mu     sync.Mutex
	queues map[string][]*leaseWaiter
}

// leaseWaiter is one request waiting for a slot.
type leaseWaiter struct {
	wake  chan struct{} // signalled when it should ask again
	slept bool          // it waited at least once (its caller's goroutine only)
}

// join queues a new waiter on pool, or returns nil if most wait already.
func (q *leaseQueues) join(pool string, most int) *leaseWaiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queues == nil {
		q.queues = make(map[string][]*leaseWaiter)
	}
	if len(q.queues[pool]) >= most {
		return nil
	}
	w := &leaseWaiter{wake: make(chan struct{}, 1)}
	q.queues[pool] = append(q.queues[pool], w)
	return w
}

// leave takes w off pool's queue; if it was the head, the next waiter
// becomes the head and is woken to ask.
func (q *leaseQueues) leave(pool string, w *leaseWaiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ws := q.queues[pool]
	i := slices.Index(ws, w)
	if i < 0 {
		return
	}
	ws = slices.Delete(ws, i, i+1)
	if len(ws) == 0 {
		delete(q.queues, pool)
		return
	}
	q.queues[pool] = ws
	if i == 0 {
		signal(ws[0].wake)
	}
}

// head reports whether w is the first waiter of pool.
func (q *leaseQueues) head(pool string, w *leaseWaiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	ws := q.queues[pool]
	return len(ws) > 0 && ws[0] == w
}

// wakeHead wakes the first waiter of pool, if any.
func (q *leaseQueues) wakeHead(pool string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if ws := q.queues[pool]; len(ws) > 0 {
		signal(ws[0].wake)
	}
}

// waiting is the number of requests waiting on pool.
func (q *leaseQueues) waiting(pool string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queues[pool])
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// LeaseOp is what a lease call did. The zero value is invalid.
type LeaseOp int

const (
	// LeaseTaken: an acquire took a new slot.
	LeaseTaken LeaseOp = iota + 1
	// LeaseRenewed: an acquire of a lease already held moved its expiry.
	LeaseRenewed
	// LeaseDenied: an acquire found the pool full.
	LeaseDenied
	// LeaseReleased: a release (Envoy's stream-done call) freed a slot.
	LeaseReleased
	// LeaseReleaseMissed: a release named a lease not held (never taken,
	// released already, or expired): nothing changed.
	LeaseReleaseMissed
	// LeaseGivenBack: the server released a lease it had just taken,
	// because a rate limit or another pool denied the request, a call
	// failed or the caller gave up.
	LeaseGivenBack
	// LeaseChecked: the pool was read (a descriptor with hits 0, a pool
	// not asked because the request was denied already, a refresh).
	LeaseChecked
	// LeaseWaited: a request that waited for a slot took one.
	LeaseWaited
	// LeaseShed: a request that could have waited was denied at once,
	// because max_waiters requests already waited on the pool here.
	LeaseShed
)

// String names the op as metrics label it.
func (o LeaseOp) String() string {
	switch o {
	case LeaseTaken:
		return "taken"
	case LeaseRenewed:
		return "renewed"
	case LeaseDenied:
		return "denied"
	case LeaseReleased:
		return "released"
	case LeaseReleaseMissed:
		return "release_missed"
	case LeaseGivenBack:
		return "given_back"
	case LeaseChecked:
		return "checked"
	case LeaseWaited:
		return "waited"
	case LeaseShed:
		return "shed"
	}
	return "invalid"
}

// LeaseObserver learns of every lease call, for metrics. ObserveLease is
// called on the request's goroutine: implementations must be safe for
// concurrent use, quick, and must not keep the event's Pool as a label
// (it holds request values).
type LeaseObserver interface {
	ObserveLease(LeaseEvent)
}

// LeaseEvent is one lease call.
type LeaseEvent struct {
	// Rule is the concurrency rule; Pool the pool's name (opaque bytes).
	Rule *config.Rule
	Pool string
	// Op is what the call did.
	Op LeaseOp
	// InFlight is the number of leases held in the pool after the call
	// (for LeaseWaited and LeaseShed, as of the last store answer).
	InFlight int64
	// Expired is the number of leases the call found expired: releases
	// Envoy never sent (or sent after the lease).
	Expired int64
}

// PoolInFlight is one pool as this server last saw it.
type PoolInFlight struct {
	// Rule is the concurrency rule; Label names the pool for people
	// (config.Rule.PoolLabel).
	Rule  *config.Rule
	Label string
	// InFlight is the number of leases held at Seen; MaxInFlight the
	// rule's max_in_flight; Waiting the requests waiting here for a slot.
	InFlight, MaxInFlight int64
	Waiting               int
	Seen                  time.Time
}

// maxPools bounds the pools the server remembers for LeasePools; beyond
// it, pools with no lease held are forgotten first, then new pools are
// not recorded until room frees.
const maxPools = 4096

// poolTable is the pools this server saw lately: bounded (maxPools).
type poolTable struct {
	mu    sync.Mutex
	pools map[string]*PoolInFlight
	// idle counts the pools with no lease held, so that a full table of
	// busy pools is not scanned on every call for a new one.
	idle int
}

// setInFlight sets e's leases held, keeping idle.
func (t *poolTable) setInFlight(e *PoolInFlight, inFlight int64) {
	switch {
	case e.InFlight == 0 && inFlight != 0:
		t.idle--
	case e.InFlight != 0 && inFlight == 0:
		t.idle++
	}
	e.InFlight = inFlight
}

// remove forgets the pool name, keeping idle.
func (t *poolTable) remove(name string) {
	if e := t.pools[name]; e != nil {
		if e.InFlight == 0 {
			t.idle--
		}
		delete(t.pools, name)
	}
}

// record notes lt's pool holding inFlight leases.
func (t *poolTable) record(lt *leaseTake, inFlight int64, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.pools[lt.pool]; e != nil {
		t.setInFlight(e, inFlight)
		e.Rule, e.MaxInFlight, e.Seen = lt.rule, lt.c.Pool.MaxInFlight, now
		return
	}
	if inFlight == 0 {
		return
	}
	if t.pools == nil {
		t.pools = make(map[string]*PoolInFlight)
	}
	if len(t.pools) >= maxPools {
		if t.idle == 0 {
			return // every pool remembered holds leases: none to forget
		}
		for name, e := range t.pools {
			if e.InFlight == 0 {
				t.remove(name)
			}
		}
	}
	label := lt.rule.PoolLabel(toEntries(nil, lt.desc))
	t.pools[lt.pool] = &PoolInFlight{Rule: lt.rule, Label: label, InFlight: inFlight, MaxInFlight: lt.c.Pool.MaxInFlight, Seen: now}
}

// LeasePools returns up to n of the pools this server saw lately, the
// fullest first (then by label): the leases each held when last asked.
// Pools with no lease held are left out.
func (s *Server) LeasePools(n int) []PoolInFlight {
	t := &s.leases.pools
	t.mu.Lock()
	out := make([]PoolInFlight, 0, len(t.pools))
	names := make([]string, 0, len(t.pools))
	for name, e := range t.pools {
		if e.InFlight > 0 {
			out = append(out, *e)
			names = append(names, name)
		}
	}
	t.mu.Unlock()
	for i := range out {
		out[i].Waiting = s.leases.queues.waiting(names[i])
	}
	slices.SortFunc(out, func(a, b PoolInFlight) int {
		return cmp.Or(cmp.Compare(b.InFlight, a.InFlight), cmp.Compare(a.Label, b.Label))
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// RefreshLeasePools asks the store again for every remembered pool that
// held a lease, so that leases that expired unreleased (which no call
// reports until the pool is used again) are counted (LeaseChecked events
// with Expired) and the in-flight numbers are current; pools that hold
// none are forgotten. Call it now and then (the daemon does, every sweep).
func (s *Server) RefreshLeasePools(ctx context.Context) {
	t := &s.leases.pools
	t.mu.Lock()
	type entry struct {
		pool string
		e    PoolInFlight
	}
	var todo []entry
	for name, e := range t.pools {
		todo = append(todo, entry{name, *e})
	}
	t.mu.Unlock()
	for _, x := range todo {
		if ctx.Err() != nil {
			return
		}
		now := s.now()
		st, err := s.leases.store.InFlight(ctx, now, x.pool)
		if err != nil {
			continue
		}
		t.mu.Lock()
		if st.InFlight == 0 {
			t.remove(x.pool)
		} else if e := t.pools[x.pool]; e != nil {
			t.setInFlight(e, st.InFlight)
			e.Seen = now
		}
		t.mu.Unlock()
		if s.leases.obs != nil && (st.Expired > 0 || st.InFlight != x.e.InFlight) {
			s.leases.obs.ObserveLease(LeaseEvent{Rule: x.e.Rule, Pool: x.pool, Op: LeaseChecked, InFlight: st.InFlight, Expired: st.Expired})
		}
	}
}
