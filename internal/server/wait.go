package server

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// wait is the waits stage: an admitted request whose decisions reserve
// tokens (Decision.Wait) waits here until they arrive (hold). If its
// caller gives up first, its takes are given back and the answer is the
// caller's context error; if they would arrive past the caller's
// deadline, it is denied instead (the decisions it returns, and admitted
// false). Any other request passes through as it is.
func (s *Server) wait(ctx context.Context, p *plan, decisions []limiter.Decision, admitted bool) ([]limiter.Decision, bool, error) {
	if !admitted || !waits(decisions) {
		return decisions, admitted, nil
	}
	left, err := s.hold(ctx, *p, decisions, s.now())
	if err == nil {
		return decisions, true, nil
	}
	if s.refundWaited(*p, decisions, s.now()) {
		s.waits.moveUp(left)
	}
	if errors.Is(err, errWaitPastDeadline) {
		// Denied instead: its tokens come too late for this caller.
		return deniedForWaits(decisions), false, nil
	}
	return nil, false, status.FromContextError(err).Err()
}

// deadlineMargin is kept between a wait and the caller's deadline, for the
// answer to reach it.
const deadlineMargin = 5 * time.Millisecond

// waitCap is the longest a call may wait for reserved tokens: --max-wait,
// and less than the caller's deadline (Envoy's timeout), since a caller
// that gives up mid-wait falls back to its failure mode, unmetered.
func (s *Server) waitCap(ctx context.Context, now time.Time) time.Duration {
	limit := s.maxWait
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, dl.Sub(now)-deadlineMargin)
	}
	return max(limit, 0)
}

// deniedForWaits is decisions with every admission that waits for reserved
// tokens turned into a denial until they arrive.
func deniedForWaits(decisions []limiter.Decision) []limiter.Decision {
	out := slices.Clone(decisions)
	for k, d := range out {
		if d.Wait > 0 {
			out[k] = limiter.Decision{RetryAfter: d.Wait, ResetAfter: d.ResetAfter}
		}
	}
	return out
}

func waits(decisions []limiter.Decision) bool {
	for _, d := range decisions {
		if d.Wait > 0 {
			return true
		}
	}
	return false
}

// refundWaited gives back what an admitted request took, when its caller
// gave up while it waited for reserved tokens, and reports whether the
// store took it back. Post-paid charges stay, and a shadow take that was
// denied took nothing.
func (s *Server) refundWaited(p plan, decisions []limiter.Decision, now time.Time) bool {
	refunder, ok := s.store.(limiter.Refunder)
	if !ok {
		return false
	}
	var back []limiter.Request
	for k, r := range p.takes {
		if r.Hits > 0 && !r.Charge() && decisions[k].Allowed {
			back = append(back, r)
		}
	}
	if len(back) == 0 {
		return true
	}
	// The caller's context is done; the refund gets its own short one.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := refunder.Refund(ctx, now, back); err != nil {
		s.logFailure(ctx, now, "", err)
		return false
	}
	return true
}

// waitQueues holds the requests of this process that wait for reserved
// tokens (limits with max_wait), per bucket. The store orders reservations
// (each one extends the bucket's debt, so a later one is ready later); the
// queues bound how many may wait on one bucket and, when a waiter gives up
// and its tokens are refunded, move up the ones reserved after it: those
// ready later than it.
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
	// behind, set when it gives up (see leave), are the waiters reserved
	// after it on its bucket.
	behind []*waiter
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

// errWaitPastDeadline is hold's error for a wait that would end past the
// caller's deadline.
var errWaitPastDeadline = errors.New("the reserved tokens arrive after the caller's deadline")

// hold waits until every reservation in decisions has arrived: each
// Decision.Wait counted from now, read after the store answered (so never
// before the store's own clock, which errs late). If the caller gives up
// first, hold returns ctx's error and the request's waiters, out of their
// queues; the caller refunds the request and, if the refund succeeded,
// calls moveUp with them. It does the same, with errWaitPastDeadline, at
// once, when the wait would end past ctx's deadline (less deadlineMargin).
func (s *Server) hold(ctx context.Context, p plan, decisions []limiter.Decision, now time.Time) ([]*waiter, error) {
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

	// The wait was capped by the caller's deadline when the request
	// arrived (waitCap); the store's answer took time since. A wait that
	// would now end past the deadline is not started: the caller would
	// give up and fall back to its failure mode, unmetered.
	if dl, ok := ctx.Deadline(); ok && s.waits.latest(mine).After(s.now().Add(time.Until(dl)-deadlineMargin)) {
		return s.waits.leave(mine), errWaitPastDeadline
	}
	for {
		ready := s.waits.latest(mine)
		d := ready.Sub(s.now())
		if d <= 0 {
			s.waits.leave(mine)
			return nil, nil
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return s.waits.leave(mine), ctx.Err()
		}
	}
}

// latest is when the last of mine is ready (moveUp may change it).
func (w *waitQueues) latest(mine []*waiter) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ready time.Time
	for _, wt := range mine {
		if wt.ready.After(ready) {
			ready = wt.ready
		}
	}
	return ready
}

// leave removes waiters from their queues. It returns them, each with
// behind set to the waiters then queued on its bucket that are ready later
// (reserved after it): those whose tokens come sooner if its own are
// refunded. Waiters that join later were reserved after the refund, or
// at least after the leaver, and are left as they are (which errs late).
func (w *waitQueues) leave(mine []*waiter) []*waiter {
	if len(mine) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wt := range mine {
		q := w.queues[wt.key]
		if q == nil {
			continue
		}
		q.waiters = slices.DeleteFunc(q.waiters, func(x *waiter) bool { return x == wt })
		wt.behind = wt.behind[:0]
		for _, x := range q.waiters {
			if x.ready.After(wt.ready) {
				wt.behind = append(wt.behind, x)
			}
		}
		if q.slots <= 0 && len(q.waiters) == 0 {
			delete(w.queues, wt.key)
		}
	}
	return mine
}

// moveUp makes the waiters behind those that left (see leave) ready sooner
// by the cost of the tokens refunded for them, and wakes them. Call it only
// once the refund succeeded: until then their tokens are still spent.
func (w *waitQueues) moveUp(left []*waiter) {
	if len(left) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wt := range left {
		for _, behind := range wt.behind {
			behind.ready = behind.ready.Add(-wt.cost)
			select {
			case behind.wake <- struct{}{}:
			default:
			}
		}
	}
}
