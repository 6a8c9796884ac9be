package limiter

import (
	"container/heap"
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"
)

// Bounds of a PoolLimit and a lease id.
const (
	// MaxPoolSize bounds PoolLimit.MaxInFlight.
	MaxPoolSize = 1 << 20
	// MinLease and MaxLease bound PoolLimit.Lease. Redis keys expire by the
	// millisecond, hence the lower bound.
	MinLease = time.Millisecond
	MaxLease = 7 * 24 * time.Hour
	// MaxLeaseID bounds the length of a lease id, in bytes.
	MaxLeaseID = 1024
)

// PoolLimit is the shape of a lease pool. The zero PoolLimit is invalid;
// call Validate before using one built from untrusted input.
type PoolLimit struct {
	// MaxInFlight is the most leases held at once, in [1, MaxPoolSize].
	MaxInFlight int64
	// Lease is how long a lease is held after its latest Acquire unless
	// released, in [MinLease, MaxLease]; only whole microseconds count.
	Lease time.Duration
}

// Validate reports whether p can be used, and why not, naming the field.
func (p PoolLimit) Validate() error {
	switch {
	case p.MaxInFlight < 1 || p.MaxInFlight > MaxPoolSize:
		return fmt.Errorf("max_in_flight %d: must be in [1, %d]", p.MaxInFlight, MaxPoolSize)
	case p.Lease < MinLease || p.Lease > MaxLease:
		return fmt.Errorf("lease %v: must be in [%v, %v]", p.Lease, MinLease, MaxLease)
	}
	return nil
}

// String gives the pool limit in the form "8 in flight, lease 10m0s".
func (p PoolLimit) String() string {
	return fmt.Sprintf("%d in flight, lease %v", p.MaxInFlight, p.Lease)
}

// LeaseRequest asks a pool for a lease.
type LeaseRequest struct {
	// Pool names the pool. Pool names are opaque: any bytes.
	Pool string
	// ID names the lease: 1 to MaxLeaseID bytes, any.
	ID string
	// Limit is the pool's shape. The leases held do not depend on it, so a
	// changed Limit applies to an existing pool (a smaller MaxInFlight
	// denies new leases until enough are released).
	Limit PoolLimit
	// MaxWait, when positive, says the caller will wait up to MaxWait for a
	// slot if the pool is full: a store shared by replicas then makes sure
	// that releases within MaxWait wake waiters elsewhere (redisstore marks
	// the pool, and its releases publish). Zero: the caller will not wait.
	MaxWait time.Duration
}

// Validate reports whether r can be given to a LeaseStore.
func (r LeaseRequest) Validate() error {
	if err := ValidateLeaseID(r.ID); err != nil {
		return err
	}
	if r.MaxWait < 0 || r.MaxWait > MaxLease {
		return fmt.Errorf("%w: max wait %v out of range [0, %v]", ErrInvalidRequest, r.MaxWait, MaxLease)
	}
	if err := r.Limit.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

// ValidateLeaseID reports whether id can name a lease: 1 to MaxLeaseID
// bytes. The error wraps ErrInvalidRequest.
func ValidateLeaseID(id string) error {
	if len(id) == 0 || len(id) > MaxLeaseID {
		return fmt.Errorf("%w: lease id of %d bytes: must be 1 to %d", ErrInvalidRequest, len(id), MaxLeaseID)
	}
	return nil
}

// LeaseDecision is what a pool answered to an Acquire.
type LeaseDecision struct {
	// Allowed reports whether the lease is held (taken or renewed).
	Allowed bool
	// Renewed reports that the pool held the id already: its expiry moved,
	// and no new slot was taken.
	Renewed bool
	// InFlight is the number of leases held after the call.
	InFlight int64
	// Remaining is MaxInFlight − InFlight, at least 0: the free slots.
	Remaining int64
	// RetryAfter is, for a denial, how long until the earliest held lease
	// expires, rounded up to the microsecond: when a slot frees at the
	// latest if no one releases nor acquires meanwhile (a release can come
	// sooner). 0 when allowed.
	RetryAfter time.Duration
	// Expired is the number of leases found expired and purged by the call.
	Expired int64
}

// LeaseRelease is what a pool answered to a Release.
type LeaseRelease struct {
	// Released reports that the id was held and its slot is free now.
	Released bool
	// InFlight is the number of leases held after the call.
	InFlight int64
	// Expired is the number of leases found expired and purged by the call
	// (the released one, had it expired, among them: it was not released).
	Expired int64
}

// PoolState is a pool read by InFlight.
type PoolState struct {
	// InFlight is the number of leases held.
	InFlight int64
	// NextExpiry is how long until the earliest held lease expires, rounded
	// up to the microsecond; 0 when none is held.
	NextExpiry time.Duration
	// Expired is the number of leases found expired and purged by the call.
	Expired int64
}

// LeaseStore keeps lease pools: concurrency limits. A pool admits at most MaxInFlight leases at once. A lease is named by its
// caller (an Envoy x-request-id) and is held from the Acquire that takes it
// until the Release that frees it, or until it expires Lease after its
// latest Acquire, whichever comes first: a lease whose release is lost
// (Envoy never sent the stream-done call) gives its slot back by itself.
// A lease expiring at t is held before t and not at t.
//
// The contract every LeaseStore keeps, and limiter/leasetest checks:
//   - Acquire of an id the pool holds is a renewal: it is always admitted,
//     holds the same one slot, and moves the lease's expiry to now+Lease
//     (an Envoy retry of one request never holds two slots, and a
//     long-running request that acquires again keeps its slot).
//   - Acquire of a new id is admitted while fewer than MaxInFlight leases
//     are held, else denied; a denial changes no lease.
//   - Release of a held id frees its slot; Release of an id that is not
//     held (never taken, released already, or expired) changes nothing,
//     so a late release cannot free another request's slot.
//   - Every call first purges the pool's expired leases and reports how
//     many (Expired), so the caller can count lost releases.
//   - A pool holds at most max(MaxInFlight) leases plus the expired ones not
//     yet purged, and a pool with no lease held takes no memory once purged
//     or swept: memory is bounded however many ids pass.
//
// Combining with rate limits (all-or-nothing): a request that carries both
// acquires its leases first, one pool after the other, and Takes its
// buckets only if every pool admitted; if a pool is full it Takes nothing,
// and if a later pool or the Take denies (or fails), it Releases the leases
// it newly acquired (LeaseDecision.Renewed false) with the same ids. This
// order is chosen over one script for leases and buckets because a
// compensating Release is exact (it removes exactly the lease added,
// whatever happened to the pool meanwhile), where a compensating Refund of
// tokens is not (a bucket refilled meanwhile cannot be given back more
// than full); because a pool and a request's buckets live in different
// Cluster hash slots, so one script could not cover them there anyway; and
// because it keeps the bucket scripts as they are. The cost is a window of
// one round trip in which the pool looks one fuller than it ends up, which
// can deny another request, never admit one too many. A renewal is not
// released on a later denial: the slot belongs to the request that first
// took it.
//
// Waiting for a slot is the caller's: a denied Acquire says how long until
// the earliest held lease expires (RetryAfter), a local Release says it
// freed a slot (LeaseRelease.Released), and a store shared by replicas
// (redisstore) publishes each release that frees a slot of a pool that
// someone may wait on (LeaseRequest.MaxWait), so that a waiter on another
// replica wakes within a round trip of it. Why, and what a waiter does, is
// in docs/design/lease-pools.md.
//
// Invalid arguments are errors wrapping ErrInvalidRequest; backend
// failures wrap ErrUnavailable (or are a *DeadlineError), after which the
// lease may or may not be held: a caller that answers the request as not
// admitted should Release the id.
//
// A store may take time from elsewhere than now (the Redis store uses the
// Redis server's clock). Implementations must be safe for concurrent use.
type LeaseStore interface {
	// Acquire takes or renews the lease r.ID in r.Pool.
	Acquire(ctx context.Context, now time.Time, r LeaseRequest) (LeaseDecision, error)
	// Release frees the lease id in pool, if held.
	Release(ctx context.Context, now time.Time, pool, id string) (LeaseRelease, error)
	// InFlight reads pool (for metrics and the /limits page).
	InFlight(ctx context.Context, now time.Time, pool string) (PoolState, error)
}

// leasePool is one pool's held leases: the model the Redis script
// (internal/redisstore/lease.lua) mirrors, expiries in Unix microseconds.
// A min-heap by expiry finds the expired and the earliest in O(log n).
type leasePool struct {
	byID map[string]*lease
	heap leaseHeap
}

type lease struct {
	id     string
	expiry int64
	index  int
}

type leaseHeap []*lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].expiry < h[j].expiry }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.index = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}

// purge drops the leases expired at now (expiry ≤ now) and returns how many.
func (p *leasePool) purge(now int64) int64 {
	var n int64
	for len(p.heap) > 0 && p.heap[0].expiry <= now {
		l := heap.Pop(&p.heap).(*lease)
		delete(p.byID, l.id)
		n++
	}
	return n
}

// untilNext is the time from now until the earliest expiry, 0 if none.
func (p *leasePool) untilNext(now int64) time.Duration {
	if len(p.heap) == 0 {
		return 0
	}
	return time.Duration(p.heap[0].expiry-now) * time.Microsecond
}

// acquire decides r at now (after purge).
func (p *leasePool) acquire(now int64, r LeaseRequest) LeaseDecision {
	expiry := now + r.Limit.Lease.Microseconds()
	held := int64(len(p.heap))
	if l, ok := p.byID[r.ID]; ok {
		l.expiry = expiry
		heap.Fix(&p.heap, l.index)
		return LeaseDecision{Allowed: true, Renewed: true, InFlight: held, Remaining: max(r.Limit.MaxInFlight-held, 0)}
	}
	if held >= r.Limit.MaxInFlight {
		return LeaseDecision{InFlight: held, RetryAfter: p.untilNext(now)}
	}
	l := &lease{id: r.ID, expiry: expiry}
	p.byID[r.ID] = l
	heap.Push(&p.heap, l)
	held++
	return LeaseDecision{Allowed: true, InFlight: held, Remaining: r.Limit.MaxInFlight - held}
}

// release frees id (after purge), reporting whether it was held.
func (p *leasePool) release(id string) bool {
	l, ok := p.byID[id]
	if ok {
		heap.Remove(&p.heap, l.index)
		delete(p.byID, id)
	}
	return ok
}

// MemoryLeases is a LeaseStore in this process: the store of a single
// replica (two processes with one each enforce two limits).
//
// Pools live in shards, each behind its own mutex. A pool left with no
// lease held by a call is dropped at once; pools whose leases all expired
// with no call since are dropped by Sweep, and by their shard sweeping
// itself as it grows, as MemoryStore's buckets are. A clock that steps
// back is read as standing still (per shard).
//
// The zero MemoryLeases is not usable; call NewMemoryLeases. It is safe
// for concurrent use.
type MemoryLeases struct {
	seed   maphash.Seed
	shards []leaseShard
}

type leaseShard struct {
	mu      sync.Mutex
	pools   map[string]*leasePool
	latest  int64 // the latest now seen, Unix µs
	sweepAt int   // the size at which the shard next sweeps
	expired int64 // leases dropped by sweeps of the shard's own, not yet reported by Sweep
}

// NewMemoryLeases returns an empty MemoryLeases; opts.Shards as for
// NewMemoryStore (default 256).
func NewMemoryLeases(opts MemoryOptions) *MemoryLeases {
	n := opts.shardCount()
	m := &MemoryLeases{seed: maphash.MakeSeed(), shards: make([]leaseShard, n)}
	for i := range m.shards {
		m.shards[i].pools = make(map[string]*leasePool)
		m.shards[i].sweepAt = minSweep
	}
	return m
}

// lock locks pool's shard and returns it with now in Unix µs, never before
// the latest the shard has seen.
func (m *MemoryLeases) lock(pool string, now time.Time) (*leaseShard, int64) {
	sh := &m.shards[maphash.String(m.seed, pool)&uint64(len(m.shards)-1)]
	sh.mu.Lock()
	sh.latest = max(sh.latest, now.UnixMicro())
	return sh, sh.latest
}

// Acquire implements LeaseStore.
func (m *MemoryLeases) Acquire(ctx context.Context, now time.Time, r LeaseRequest) (LeaseDecision, error) {
	if err := r.Validate(); err != nil {
		return LeaseDecision{}, fmt.Errorf("acquire lease: %w", err)
	}
	sh, nowUS := m.lock(r.Pool, now)
	defer sh.mu.Unlock()
	p := sh.pools[r.Pool]
	var expired int64
	if p == nil {
		p = &leasePool{byID: make(map[string]*lease)}
	} else {
		expired = p.purge(nowUS)
	}
	d := p.acquire(nowUS, r)
	d.Expired = expired
	sh.keep(r.Pool, p, nowUS)
	return d, nil
}

// Release implements LeaseStore.
func (m *MemoryLeases) Release(ctx context.Context, now time.Time, pool, id string) (LeaseRelease, error) {
	if err := ValidateLeaseID(id); err != nil {
		return LeaseRelease{}, fmt.Errorf("release lease: %w", err)
	}
	var res LeaseRelease
	m.update(pool, now, func(p *leasePool, nowUS, expired int64) {
		res.Expired = expired
		res.Released = p.release(id)
		res.InFlight = int64(len(p.heap))
	})
	return res, nil
}

// InFlight implements LeaseStore.
func (m *MemoryLeases) InFlight(ctx context.Context, now time.Time, pool string) (PoolState, error) {
	var st PoolState
	m.update(pool, now, func(p *leasePool, nowUS, expired int64) {
		st.Expired = expired
		st.InFlight, st.NextExpiry = int64(len(p.heap)), p.untilNext(nowUS)
	})
	return st, nil
}

// update calls f on pool's pool, if there is one, under its shard's lock:
// with the time in Unix µs (as lock gives it) and the number of expired
// leases purged from it just before. Then it keeps the pool, or drops it
// if it holds no lease.
func (m *MemoryLeases) update(pool string, now time.Time, f func(p *leasePool, nowUS, expired int64)) {
	sh, nowUS := m.lock(pool, now)
	defer sh.mu.Unlock()
	p := sh.pools[pool]
	if p == nil {
		return
	}
	f(p, nowUS, p.purge(nowUS))
	sh.keep(pool, p, nowUS)
}

// keep stores p as pool, or drops it if it holds no lease; the caller holds
// sh.mu.
func (sh *leaseShard) keep(pool string, p *leasePool, nowUS int64) {
	if len(p.heap) == 0 {
		delete(sh.pools, pool)
		return
	}
	if _, ok := sh.pools[pool]; ok {
		return
	}
	sh.pools[pool] = p
	if len(sh.pools) >= sh.sweepAt {
		sh.expired += sh.sweep(nowUS)
	}
}

// sweep purges every pool of the shard, drops the empty ones, and returns
// the number of leases purged; the caller holds sh.mu.
func (sh *leaseShard) sweep(nowUS int64) int64 {
	var n int64
	before := len(sh.pools)
	for name, p := range sh.pools {
		n += p.purge(nowUS)
		if len(p.heap) == 0 {
			delete(sh.pools, name)
		}
	}
	if len(sh.pools) < before/2 {
		// Go maps never shrink: copy the survivors into a right-sized one.
		fresh := make(map[string]*leasePool, len(sh.pools))
		for name, p := range sh.pools {
			fresh[name] = p
		}
		sh.pools = fresh
	}
	sh.sweepAt = max(minSweep, 2*len(sh.pools))
	return n
}

// Sweep purges the expired leases of every pool at now and drops the pools
// left empty. It returns the number of leases that expired unreported
// since the last Sweep: those it purged, and those the shards' own sweeps
// did, which no call reported. Call it now and then (a metrics scrape):
// a pool that sees no call after its leases expire is counted only here.
func (m *MemoryLeases) Sweep(now time.Time) (expired int64) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		sh.latest = max(sh.latest, now.UnixMicro())
		expired += sh.sweep(sh.latest) + sh.expired
		sh.expired = 0
		sh.mu.Unlock()
	}
	return expired
}

// Pools returns the number of pools held (with a lease held, or expired
// leases not yet purged).
func (m *MemoryLeases) Pools() int {
	return countLocked(m.shards,
		func(sh *leaseShard) *sync.Mutex { return &sh.mu },
		func(sh *leaseShard) int { return len(sh.pools) })
}

var _ LeaseStore = (*MemoryLeases)(nil)
