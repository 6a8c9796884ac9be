package server

import (
	"context"
	"errors"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// Concurrency limits: a descriptor that reaches a config.KindConcurrency
// rule holds a lease of the rule's pool (limiter.LeaseStore) while the
// request runs. Envoy sends it twice: at request time with hits ≥ 1
// (Acquire: the lease named by the descriptor's last value, Envoy's
// x-request-id), and when the stream is done with is_negative_hits
// (Release). A descriptor with hits 0 only reads the pool.
//
// A request that carries leases and rate limits is admitted all or
// nothing (docs/design/lease-pools.md): its leases are acquired first, in
// descriptor order, stopping at the first denial; its buckets are taken
// only if every lease was; and the leases it newly acquired (not those it
// renewed) are released again if a lease or a bucket denies, or a call
// fails. So a request denied by a rate limit holds no slot, and one denied
// for a slot spends no tokens: its buckets are only checked.

// leasePlan is the leases stage's part of a plan.
type leasePlan struct {
	// leases are the concurrency descriptors' leases, each item's at
	// item.lease-1.
	leases []leaseTake
}

// leaseOp is what a lease descriptor asks. The zero value is invalid.
type leaseOp int

const (
	leaseAcquire leaseOp = iota + 1
	leaseRelease
	leaseCheck
)

// leaseTake is one concurrency descriptor of a request and its answer.
type leaseTake struct {
	item  int
	desc  *ratelimitv3.RateLimitDescriptor
	rule  *config.Rule
	c     *config.Concurrency
	pool  string
	id    string
	op    leaseOp
	asked bool // the store answered for it
	// decision answers an acquire or a check (Allowed, InFlight, Remaining,
	// RetryAfter), release a release.
	decision limiter.LeaseDecision
	release  limiter.LeaseRelease
	// waited: admitted after waiting for a slot; full: denied at once
	// because max_waiters requests already wait on the pool here.
	waited, full bool
}

// status fills st's remaining slots and says how the descriptor fared, for
// setStatuses: admitted, the wait until a slot frees (denied) or 0, and
// the limit Envoy is shown.
func (lt *leaseTake) status(st *rlsv3.RateLimitResponse_DescriptorStatus) (bool, time.Duration, *config.RateLimit) {
	limit := lt.c.RateLimit()
	switch lt.op {
	case leaseRelease:
		st.LimitRemaining = clampUint32(lt.c.Pool.MaxInFlight - lt.release.InFlight)
		return true, 0, limit
	default:
		d := lt.decision
		st.LimitRemaining = clampUint32(d.Remaining)
		if !d.Allowed {
			return false, d.RetryAfter, limit
		}
		return true, 0, limit
	}
}

// admitted reports whether lt lets its request through: a release always
// does, an acquire or a check when the store allowed it (as status says).
func (lt *leaseTake) admitted() bool {
	return lt.op == leaseRelease || lt.decision.Allowed
}

// planLeases lists the leases of p's concurrency descriptors: the pool is
// the rule's (config.Rule.AppendPool), the lease id the descriptor's last
// value (a value longer than limiter.MaxLeaseID stands as longValue).
func planLeases(p *plan) {
	var entries []config.Entry
	for i := range p.items {
		it := &p.items[i]
		if it.rule == nil || it.rule.Kind != config.KindConcurrency || it.rule.Concurrency == nil || it.limited || it.replaced {
			continue
		}
		d := p.descs[i]
		entries = toEntries(entries[:0], d)
		if len(entries) == 0 {
			continue
		}
		id := entries[len(entries)-1].Value
		if len(id) > limiter.MaxLeaseID {
			id = longValue(id)
		}
		lt := leaseTake{item: i, desc: d, rule: it.rule, c: it.rule.Concurrency, pool: string(it.rule.AppendPool(nil, entries)), id: id, op: leaseAcquire}
		switch {
		case d.GetIsNegativeHits():
			lt.op = leaseRelease
		case it.hits == 0:
			lt.op = leaseCheck
		}
		if it.quota {
			// A slot is not a quota: quota mode does not apply to it.
			it.quota = false
			p.quotas--
		}
		p.leases = append(p.leases, lt)
		it.lease = len(p.leases)
	}
}

// acquireLeases is the leases stage: for a request with concurrency
// descriptors it makes p's releases, then its checks, then its acquires
// (waiting for a slot where the rule allows), all or nothing (see the top
// of this file): when a lease is denied, it gives back the leases it
// acquired and turns p's takes into checks. It returns the leases newly
// acquired (not those renewed), which the caller gives back (giveBackAll)
// unless the request is admitted, and the time the stages after it decide
// at: now, or the time it stopped waiting for a slot. On an error it has
// given back what it acquired.
func (s *Server) acquireLeases(ctx context.Context, now time.Time, p *plan) ([]*leaseTake, time.Time, error) {
	if len(p.leases) == 0 {
		return nil, now, nil
	}
	ls := &s.leases
	checkDenied := false // a check of a pool over its limit (see checkLease)
	for k := range p.leases {
		lt := &p.leases[k]
		switch lt.op {
		case leaseRelease:
			rel, err := ls.store.Release(ctx, now, lt.pool, lt.id)
			if err != nil {
				s.logFailure(ctx, now, p.domain, err)
				return nil, now, statusFromError(err)
			}
			lt.release, lt.asked = rel, true
			op := LeaseReleased
			if !rel.Released {
				op = LeaseReleaseMissed
			}
			// Recorded before a waiter is woken: the count the waiter's
			// acquire reports is the newer one, and must be recorded last.
			ls.observe(lt, op, rel.InFlight, rel.Expired)
			if rel.Released {
				ls.wake(lt.pool)
			}
		case leaseCheck:
			if err := s.checkLease(ctx, now, lt); err != nil {
				s.logFailure(ctx, now, p.domain, err)
				return nil, now, statusFromError(err)
			}
			checkDenied = checkDenied || !lt.decision.Allowed && !p.items[lt.item].shadow
		}
	}
	var held []*leaseTake // newly acquired: given back unless admitted
	denied, waited := checkDenied, false
	for k := range p.leases {
		lt := &p.leases[k]
		if lt.op != leaseAcquire {
			continue
		}
		if denied {
			// Not asked: the request is denied already. Its state is read,
			// as a denied request's buckets are checked.
			lt.op = leaseCheck
			if err := s.checkLease(ctx, now, lt); err != nil {
				ls.giveBackAll(held)
				s.logFailure(ctx, now, p.domain, err)
				return nil, now, statusFromError(err)
			}
			continue
		}
		err := s.acquireLease(ctx, now, lt, p.items[lt.item].shadow)
		if err != nil {
			// The outcome is unknown: the lease may be held, but it is not
			// given back, since it may be a renewal of the slot of a
			// request still running (releasing that would admit one more
			// than max_in_flight). A slot so taken by a call whose answer
			// was lost frees itself when its lease ends.
			ls.giveBackAll(held)
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return nil, now, status.FromContextError(err).Err()
			}
			s.logFailure(ctx, now, p.domain, err)
			return nil, now, statusFromError(err)
		}
		waited = waited || lt.waited
		switch {
		case lt.decision.Allowed && !lt.decision.Renewed:
			held = append(held, lt)
		case !lt.decision.Allowed && !p.items[lt.item].shadow:
			denied = true
		}
	}
	if waited {
		now = s.now() // the buckets are asked now, not when the call came
	}
	if denied {
		ls.giveBackAll(held)
		held = nil
		// Denied for a slot: the buckets are only checked, and spend
		// nothing (post-paid charges are recorded all the same).
		p.takes = append([]limiter.Request(nil), p.takes...)
		for k := range p.takes {
			if !p.takes[k].Charge() {
				p.takes[k].Hits = 0
			}
			p.takes[k].MaxWait = 0
		}
	}
	return held, now, nil
}

// checkLease reads lt's pool, as hits 0 checks a bucket: admitted unless
// the pool holds more than max_in_flight (a bucket checked is admitted
// unless in debt), so a check never denies on a pool that is merely full.
func (s *Server) checkLease(ctx context.Context, now time.Time, lt *leaseTake) error {
	st, err := s.leases.store.InFlight(ctx, now, lt.pool)
	if err != nil {
		return err
	}
	free := lt.c.Pool.MaxInFlight - st.InFlight
	lt.decision = limiter.LeaseDecision{Allowed: free >= 0, InFlight: st.InFlight, Remaining: max(free, 0), Expired: st.Expired}
	if free < 0 {
		lt.decision.RetryAfter = st.NextExpiry
	}
	lt.asked = true
	s.leases.observe(lt, LeaseChecked, st.InFlight, st.Expired)
	return nil
}

// acquireLease takes or renews lt's lease, waiting for a slot (FIFO per
// pool on this replica) when the rule has max_wait, for at most max_wait
// and never past the caller's deadline (less deadlineMargin). A shadow
// rule never waits. It returns an error only when the store failed or the
// caller gave up; lt.decision is then not to be trusted.
func (s *Server) acquireLease(ctx context.Context, now time.Time, lt *leaseTake, shadow bool) error {
	ls := &s.leases
	r := limiter.LeaseRequest{Pool: lt.pool, ID: lt.id, Limit: lt.c.Pool}
	wait := time.Duration(0)
	if lt.c.MaxWait > 0 && !shadow {
		wait = min(lt.c.MaxWait, s.waitCap(ctx, now))
	}
	if wait <= 0 {
		return s.tryLease(ctx, now, lt, r)
	}
	deadline := now.Add(wait)
	w := ls.queues.join(lt.pool, lt.c.MaxWaiters)
	if w == nil {
		// Too many wait here already: shed at once, unless a slot is free.
		if err := s.tryLease(ctx, now, lt, r); err != nil {
			return err
		}
		if !lt.decision.Allowed {
			lt.full = true
			ls.observe(lt, LeaseShed, lt.decision.InFlight, 0)
		}
		return nil
	}
	defer ls.queues.leave(lt.pool, w)
	attempted := false
	for {
		if ls.queues.head(lt.pool, w) {
			// The head asks; those behind it wait for their turn.
			// Woken at or after the deadline, it asks once more without
			// waiting (a negative MaxWait is an invalid request).
			r.MaxWait = max(deadline.Sub(now), 0)
			if err := s.tryLease(ctx, now, lt, r); err != nil {
				return err
			}
			attempted = true
			if lt.decision.Allowed {
				if lt.waited = w.slept; lt.waited {
					ls.observe(lt, LeaseWaited, lt.decision.InFlight, 0)
				}
				return nil // leaving, it lets the next waiter ask
			}
		}
		left := deadline.Sub(now)
		if left <= 0 {
			break
		}
		sleep := left
		if attempted && ls.queues.head(lt.pool, w) && lt.decision.RetryAfter > 0 {
			sleep = min(sleep, lt.decision.RetryAfter)
		}
		t := time.NewTimer(sleep)
		w.slept = true
		select {
		case <-t.C:
		case <-w.wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		now = s.now()
	}
	if !attempted {
		// Never reached the head: report the pool as it is.
		r.MaxWait = 0
		if err := s.tryLease(ctx, now, lt, r); err != nil {
			return err
		}
	}
	return nil
}

// tryLease asks the store for lt's lease once.
func (s *Server) tryLease(ctx context.Context, now time.Time, lt *leaseTake, r limiter.LeaseRequest) error {
	d, err := s.leases.store.Acquire(ctx, now, r)
	if err != nil {
		return err
	}
	lt.decision, lt.asked = d, true
	op := LeaseTaken
	switch {
	case d.Renewed:
		op = LeaseRenewed
	case !d.Allowed:
		op = LeaseDenied
	}
	s.leases.observe(lt, op, d.InFlight, d.Expired)
	return nil
}

// LeaseReleased tells the server that a lease of pool was released
// elsewhere (another replica, through the store's pub/sub): the first
// request waiting here for a slot of pool asks again. It is safe to call
// at any time, for any pool.
func (s *Server) LeaseReleased(pool string) { s.leases.wake(pool) }

// LeaseStore is the store the server keeps lease pools in.
func (s *Server) LeaseStore() limiter.LeaseStore { return s.leases.store }

// leaseState is the server's lease store, its waiters and its observer.
type leaseState struct {
	now    func() time.Time
	store  limiter.LeaseStore
	obs    LeaseObserver
	queues leaseQueues
	pools  poolTable
}

func (ls *leaseState) init(now func() time.Time, store limiter.LeaseStore, obs LeaseObserver) {
	ls.now = now
	if store == nil {
		store = limiter.NewMemoryLeases(limiter.MemoryOptions{})
	}
	ls.store, ls.obs = store, obs
}

// wake lets the head waiter of pool ask again.
func (ls *leaseState) wake(pool string) { ls.queues.wakeHead(pool) }

// giveBack releases lt's lease, held by a request that is not admitted
// after all (or whose acquire's outcome is unknown). The caller's context
// may be done: the release gets its own short one.
func (ls *leaseState) giveBack(lt *leaseTake) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rel, err := ls.store.Release(ctx, ls.now(), lt.pool, lt.id)
	if err != nil {
		return // the lease expires by itself
	}
	if rel.Released {
		ls.observe(lt, LeaseGivenBack, rel.InFlight, rel.Expired) // before the wake: see acquireLeases
		ls.wake(lt.pool)
	} else if rel.Expired > 0 {
		ls.observe(lt, LeaseChecked, rel.InFlight, rel.Expired)
	}
}

// giveBackAll gives back each of held (see giveBack).
func (ls *leaseState) giveBackAll(held []*leaseTake) {
	for _, lt := range held {
		ls.giveBack(lt)
	}
}

// observe records a lease call in the pool table and tells the observer.
func (ls *leaseState) observe(lt *leaseTake, op LeaseOp, inFlight, expired int64) {
	if op != LeaseShed && op != LeaseWaited {
		ls.pools.record(lt, inFlight, ls.now())
	}
	if ls.obs != nil {
		ls.obs.ObserveLease(LeaseEvent{Rule: lt.rule, Pool: lt.pool, Op: op, InFlight: inFlight, Expired: expired})
	}
}
