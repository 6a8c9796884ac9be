// Package denialcache keeps, on one replica, the denials a shared
// limiter.Store (Redis) has answered, and denies further requests for those
// buckets locally, without asking the store, for as long as the store's own
// answer proves they must be denied.
//
// The proof: when the store denies n tokens of a bucket with RetryAfter r,
// it decided at some instant at or after the call was sent, and the bucket
// then needed r more to hold n tokens. Tokens only arrive with time, and
// other replicas can only take them, never add any; so until sendTime + r,
// measured on the local monotonic clock, the bucket cannot admit n or more
// tokens. A request for at least n tokens of the same bucket, under the same
// Limit, is denied locally until then. The cache only ever denies, never
// admits, and it never denies past that instant: at and after it the store
// is asked again.
//
// It assumes the store's clock runs at the rate of the local one (Redis
// TIME, on a host kept by NTP: errors of parts per million), and that the
// bucket's state survives (a Redis that loses its data refills every bucket
// at once; this replica then keeps denying the buckets it knew until their
// deadlines, at most one RetryAfter).
//
// Only single-request Takes are cached: an all-or-nothing Take of several
// buckets says which one denied only through its decisions, and the others
// may be admitted next time. Checks (Hits 0), reservations (MaxWait) and
// requests on post-paid buckets (Limit.MaxDebt, whose charges must always
// be recorded) always go to the store. Shadow requests are cached like the
// others: their denial is the bucket's, and charges nothing.
//
// A refund (limiter.Refunder) makes a bucket fuller, against the proof.
// Refunds through this replica's layers forget the buckets they name; a
// refund on another replica can leave this one denying a bucket until its
// deadline though the refund made room (at most one RetryAfter, and only
// after a refund).
package denialcache

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// DefaultMaxEntries is the default of Options.MaxEntries: with keys of
// about a hundred bytes, some 15 MB when full.
const DefaultMaxEntries = 1 << 16

// exceedsFor is how long an ExceedsBurst denial is remembered. It would be
// true for as long as the Limit stays (the entry is keyed by it), but the
// answer also carries ResetAfter, which only the store knows: asking again
// once a second keeps that fresh enough.
const exceedsFor = time.Second

// numShards splits the cache so that replicas' goroutines rarely contend.
const numShards = 64

// Options configures a Cache. The zero value means the defaults.
type Options struct {
	// MaxEntries bounds the buckets remembered (rounded up to a multiple
	// of 64). When a shard is full, entries whose deadline has passed are
	// dropped first, then arbitrary ones (forgetting only denies less).
	// Default DefaultMaxEntries.
	MaxEntries int
	// Now is the local clock, read when a call is sent to the store and
	// when a request is looked up. It must be monotonic (time.Now's
	// readings are). Default time.Now.
	Now func() time.Time
}

// Cache is a table of denials shared by a Learn layer (which fills it from
// the store's answers) and a Front layer (which answers from it). The zero
// Cache is not usable; call New. It is safe for concurrent use.
type Cache struct {
	now      func() time.Time
	seed     maphash.Seed
	perShard int
	shards   [numShards]shard

	localDenials atomic.Int64
	learned      atomic.Int64
}

// shard is one lock and its part of the table, padded to its own cache
// lines.
type shard struct {
	mu sync.Mutex
	m  map[string]entry
	// nextSweep is the earliest deadline among the entries when last
	// swept: sweeping before it finds nothing to drop.
	nextSweep time.Time
	_         [64]byte
}

// entry says: under limit, the bucket cannot admit hits or more tokens
// before until. For an ExceedsBurst denial, hits is Burst+1: no request for
// more than Burst ever passes.
type entry struct {
	limit   limiter.Limit
	hits    int64
	until   time.Time
	resetAt time.Time // the bucket is not full before it
	exceeds bool
}

// Stats counts what a Cache did since New.
type Stats struct {
	// LocalDenials is the number of requests denied from the cache.
	LocalDenials int64
	// Learned is the number of denials the cache took from the store.
	Learned int64
}

// New returns an empty Cache.
func New(opts Options) (*Cache, error) {
	if opts.MaxEntries < 0 {
		return nil, fmt.Errorf("denialcache: Options.MaxEntries %d: must not be negative", opts.MaxEntries)
	}
	if opts.MaxEntries == 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Cache{
		now:      opts.Now,
		seed:     maphash.MakeSeed(),
		perShard: (opts.MaxEntries + numShards - 1) / numShards,
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string]entry)
	}
	return c, nil
}

// Stats returns the counts so far.
func (c *Cache) Stats() Stats {
	return Stats{LocalDenials: c.localDenials.Load(), Learned: c.learned.Load()}
}

// Len returns the number of buckets remembered, expired or not.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Learn returns a limiter.Store that passes every Take to store and
// remembers the denials it answers to single requests. store must be the
// shared store itself, whose every answer is the bucket's: not a layer that
// answers from elsewhere when the store fails (failover's deny or local
// modes), or the cache would take those answers for the bucket's.
func (c *Cache) Learn(store limiter.Store) limiter.Store {
	return learner{c: c, store: store}
}

// Front returns a limiter.Store that denies from the cache the requests it
// can, and passes the others to next. next is typically the failure
// handling over a Learn layer over the shared store.
func (c *Cache) Front(next limiter.Store) limiter.Store {
	return front{c: c, next: next}
}

// Wrap is c.Front(c.Learn(store)): the cache in front of a store whose
// every answer is the bucket's.
func (c *Cache) Wrap(store limiter.Store) limiter.Store {
	return c.Front(c.Learn(store))
}

type learner struct {
	c     *Cache
	store limiter.Store
}

// Take implements limiter.Store.
func (l learner) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	if len(reqs) != 1 || !cacheable(reqs[0]) {
		return l.store.Take(ctx, now, reqs)
	}
	sent := l.c.now()
	d, err := l.store.Take(ctx, now, reqs)
	if err == nil && len(d) == 1 {
		l.c.learn(reqs[0], d[0], sent)
	}
	return d, err
}

// Refund implements limiter.Refunder: it forgets the buckets named and
// passes the refund to the store, if that can take it.
func (l learner) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	return l.c.refund(ctx, now, reqs, l.store)
}

// cacheable reports whether a denial of r proves what the cache needs, and
// answering r from the cache skips nothing the store must see.
func cacheable(r limiter.Request) bool {
	return r.Hits > 0 && r.MaxWait == 0 && r.Limit.MaxDebt == 0
}

type front struct {
	c    *Cache
	next limiter.Store
}

// Take implements limiter.Store.
func (f front) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	if len(reqs) == 1 {
		if d, ok := f.c.lookup(reqs[0]); ok {
			return []limiter.Decision{d}, nil
		}
	}
	return f.next.Take(ctx, now, reqs)
}

// Refund implements limiter.Refunder: it forgets the buckets named and
// passes the refund to next, if that can take it.
func (f front) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	return f.c.refund(ctx, now, reqs, f.next)
}

// refund forgets the buckets reqs name, before the refund and again after
// it: a denial learned from a Take answered while the refund was on its way
// may predate it.
func (c *Cache) refund(ctx context.Context, now time.Time, reqs []limiter.Request, next limiter.Store) error {
	refunder, ok := next.(limiter.Refunder)
	if !ok {
		c.drop(reqs)
		return fmt.Errorf("%w: the backend cannot give tokens back", limiter.ErrInvalidRequest)
	}
	c.drop(reqs)
	err := refunder.Refund(ctx, now, reqs)
	c.drop(reqs)
	return err
}

// drop forgets the buckets reqs name.
func (c *Cache) drop(reqs []limiter.Request) {
	for _, r := range reqs {
		sh := c.shard(r.Key)
		sh.mu.Lock()
		delete(sh.m, r.Key)
		sh.mu.Unlock()
	}
}

func (c *Cache) shard(key string) *shard {
	return &c.shards[maphash.String(c.seed, key)%numShards]
}

// lookup answers r from the cache if it can.
func (c *Cache) lookup(r limiter.Request) (limiter.Decision, bool) {
	if !cacheable(r) || r.Hits > limiter.MaxTokens {
		return limiter.Decision{}, false
	}
	sh := c.shard(r.Key)
	sh.mu.Lock()
	e, ok := sh.m[r.Key]
	sh.mu.Unlock()
	if !ok {
		return limiter.Decision{}, false
	}
	now := c.now()
	if !now.Before(e.until) {
		sh.mu.Lock()
		if e, ok := sh.m[r.Key]; ok && !now.Before(e.until) {
			delete(sh.m, r.Key)
		}
		sh.mu.Unlock()
		return limiter.Decision{}, false
	}
	if e.limit != r.Limit || r.Hits < e.hits || !e.exceeds && r.Hits > r.Limit.Burst {
		return limiter.Decision{}, false
	}
	c.localDenials.Add(1)
	if e.exceeds {
		return limiter.Decision{ResetAfter: ceilPositive(e.resetAt.Sub(now)), ExceedsBurst: true}, true
	}
	retry := ceilPositive(e.until.Sub(now))
	return limiter.Decision{RetryAfter: retry, ResetAfter: max(retry, ceilPositive(e.resetAt.Sub(now)))}, true
}

// ceilPositive rounds d up to the microsecond; 0 if it is not positive.
func ceilPositive(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + time.Microsecond - 1).Truncate(time.Microsecond)
}

// learn records the store's decision d on r, a call sent at sent.
func (c *Cache) learn(r limiter.Request, d limiter.Decision, sent time.Time) {
	var e entry
	switch {
	case d.Allowed:
		// An admitted request for at least what an entry denies means the
		// entry is wrong (the bucket lost its state): forget it.
		c.forget(r)
		return
	case d.ExceedsBurst:
		e = entry{limit: r.Limit, hits: r.Limit.Burst + 1, until: sent.Add(exceedsFor), resetAt: sent.Add(d.ResetAfter), exceeds: true}
	case d.RetryAfter > 0:
		e = entry{limit: r.Limit, hits: r.Hits, until: sent.Add(d.RetryAfter), resetAt: sent.Add(d.ResetAfter)}
	default:
		return
	}
	c.learned.Add(1)
	sh := c.shard(r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[r.Key]; !ok && len(sh.m) >= c.perShard {
		sh.makeRoom(c.now(), c.perShard)
	}
	key := r.Key
	if _, ok := sh.m[key]; !ok {
		// The request's key may live in a buffer its caller reuses.
		key = strings.Clone(key)
	}
	sh.m[key] = e
	if e.until.Before(sh.nextSweep) {
		sh.nextSweep = e.until
	}
}

// forget drops r's entry if it denies r.
func (c *Cache) forget(r limiter.Request) {
	sh := c.shard(r.Key)
	sh.mu.Lock()
	if e, ok := sh.m[r.Key]; ok && e.limit == r.Limit && r.Hits >= e.hits {
		delete(sh.m, r.Key)
	}
	sh.mu.Unlock()
}

// makeRoom frees at least one place in a full shard: the entries past their
// deadline if any (at most one sweep per earliest deadline), else one
// arbitrary entry. sh.mu is held.
func (sh *shard) makeRoom(now time.Time, capacity int) {
	if !now.Before(sh.nextSweep) {
		var next time.Time
		for k, e := range sh.m {
			if !now.Before(e.until) {
				delete(sh.m, k)
			} else if next.IsZero() || e.until.Before(next) {
				next = e.until
			}
		}
		sh.nextSweep = next
	}
	if len(sh.m) < capacity {
		return
	}
	for k := range sh.m {
		delete(sh.m, k)
		break
	}
}
