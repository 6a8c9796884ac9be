package server

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// waitQueues holds the requests of this process that wait for reserved
// tokens (limits with max_wait), per bucket, in arrival order. The store
// orders reservations (each one extends the bucket's debt); the queues
// bound how many may wait on one bucket and, when a waiter gives up and
// its tokens are refunded, move the ones behind it up.
type waitQueues struct {
	mu     sync.Mutex
	queues map[string]*waitQueue
}

type waitQueue struct {
	slots   int // requests admitted to wait or about to ask the store
	waiters []*waiter
}

// waiter is one reservation held by a request.
type waiter struct {
	key   string
	ready time.Time     // when its tokens have arrived
	cost  time.Duration // how long its tokens take: what those behind gain when it leaves
	wake  chan struct{} // the request's, signalled when ready moves earlier
}

// claim takes a waiting slot for every take of p that may wait, or turns
// its waiting off when its bucket's queue is full (reporting it in full).
// The caller must call release(p, claimed) afterwards. A request that may
// not wait (the common case) takes no lock.
func (w *waitQueues) claim(p *plan) (claimed []bool, full []bool) {
	if !slices.ContainsFunc(p.takes, func(r limiter.Request) bool { return r.MaxWait > 0 }) {
		return nil, nil
	}
	claimed, full = make([]bool, len(p.takes)), make([]bool, len(p.takes))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.queues == nil {
		w.queues = make(map[string]*waitQueue)
	}
	for _, it := range p.items {
		if !it.limited {
			continue
		}
		for j, l := range it.limits {
			k := it.first + j
			r := &p.takes[k]
			if r.MaxWait <= 0 {
				continue
			}
			q := w.queues[r.Key]
			if q == nil {
				q = &waitQueue{}
				w.queues[r.Key] = q
			}
			if q.slots >= l.MaxWaiters {
				r.MaxWait, full[k] = 0, true
				continue
			}
			q.slots++
			claimed[k] = true
		}
	}
	return claimed, full
}

// release gives back the slots claim took.
func (w *waitQueues) release(p *plan, claimed []bool) {
	if claimed == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, c := range claimed {
		if !c {
			continue
		}
		key := p.takes[k].Key
		if q := w.queues[key]; q != nil {
			if q.slots--; q.slots <= 0 && len(q.waiters) == 0 {
				delete(w.queues, key)
			}
		}
	}
}

// hold waits until every reservation in decisions has arrived. It returns
// ctx's error if the caller gives up first; the caller then refunds the
// request, and hold has already moved the waiters behind it up.
func (s *Server) hold(ctx context.Context, p plan, decisions []limiter.Decision, now time.Time) error {
	wake := make(chan struct{}, 1)
	var mine []*waiter
	s.waits.mu.Lock()
	for k, d := range decisions {
		if d.Wait <= 0 {
			continue
		}
		r := p.takes[k]
		wt := &waiter{key: r.Key, ready: now.Add(d.Wait), cost: r.Limit.TimeFor(r.Hits), wake: wake}
		mine = append(mine, wt)
		q := s.waits.queues[r.Key]
		if q == nil { // a slot always exists while claimed; be safe
			q = &waitQueue{}
			s.waits.queues[r.Key] = q
		}
		q.waiters = append(q.waiters, wt)
	}
	s.waits.mu.Unlock()
	defer s.waits.leave(mine, false)

	for {
		s.waits.mu.Lock()
		var ready time.Time
		for _, wt := range mine {
			if wt.ready.After(ready) {
				ready = wt.ready
			}
		}
		s.waits.mu.Unlock()
		d := ready.Sub(s.now())
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			s.waits.leave(mine, true)
			mine = nil
			return ctx.Err()
		}
	}
}

// leave removes waiters from their queues. When they gave up early, every
// waiter behind them on the same bucket becomes ready sooner by their cost.
func (w *waitQueues) leave(mine []*waiter, early bool) {
	if len(mine) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wt := range mine {
		q := w.queues[wt.key]
		if q == nil {
			continue
		}
		for i, x := range q.waiters {
			if x != wt {
				continue
			}
			if early {
				for _, behind := range q.waiters[i+1:] {
					behind.ready = behind.ready.Add(-wt.cost)
					select {
					case behind.wake <- struct{}{}:
					default:
					}
				}
			}
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			break
		}
		if q.slots <= 0 && len(q.waiters) == 0 {
			delete(w.queues, wt.key)
		}
	}
}
