// Package denialcache keeps, on one replica, the denials a shared
// limiter.Store (Redis) has answered, and denies further requests for those
// buckets locally, without asking the store, for as long as the store's own
// answer proves they must be denied, with the answer the store would give.
//
// A Cache is shared by two layers: Learn, below it, fills it from the
// store's answers; Front, above it, answers from it (Wrap stacks both).
// What it guarantees:
//
//   - It never admits. It learns only from the store's own denials, never
//     from an answer that was on its way while a refund, admission or
//     charge of that bucket went through this replica's layers.
//   - A denial of n tokens answers locally only requests for m ≥ n tokens
//     of the same bucket under the same Limit, while n tokens cannot have
//     arrived, and for at most MaxAge after the call that learned it was
//     sent. The answer is the Decision limiter.Decide gives for m on the
//     bucket's state (m's own RetryAfter, the ResetAfter, or ExceedsBurst);
//     when that hangs on a fraction of a microsecond the store's answer did
//     not tell, the store is asked.
//   - Only single-request Takes are cached. Checks (Hits 0), reservations
//     (MaxWait) and requests on post-paid buckets (Limit.MaxDebt) always go
//     to the store. A Take or Refund through Learn that spends from or
//     refills a bucket makes the cache forget it, and so does one under
//     another Limit than the cache knows the bucket under (it rescales the
//     bucket: see limiter.State).
//   - Other replicas' takes since a denial make its RetryAfter and
//     ResetAfter shorter than the store's by what they took; tokens that
//     come back unseen (another replica's refund, a Cluster give-back, a
//     store that lost its data) make it deny for at most MaxAge longer.
//
// It assumes the store's clock runs at the rate of the local one and is read
// to the microsecond (Redis TIME). Memory is bounded by MaxEntries and by
// MaxBytes, which counts each entry's key. A Cache is safe for concurrent
// use.
//
// The argument that a local denial is one the store would give, and its
// bounds, is in docs/design/denial-cache.md.
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

// DefaultMaxEntries is the default of Options.MaxEntries.
const DefaultMaxEntries = 1 << 16

// MaxEntriesLimit is the largest Options.MaxEntries New accepts (a larger
// one would overflow the byte budget derived from it).
const MaxEntriesLimit = 1 << 26

// BytesPerEntry is what Options.MaxBytes defaults to per entry of
// Options.MaxEntries: 16 MiB at DefaultMaxEntries, which holds some 49,000
// buckets with keys of 100 bytes, or 3,800 with keys of 4 KiB.
const BytesPerEntry = 256

// EntryOverhead is what one entry counts against Options.MaxBytes beyond
// its key's bytes: about what it takes besides them (its map slot at the
// map's lowest load, and the key's allocation).
const EntryOverhead = 240

// DefaultMaxAge is the default of Options.MaxAge.
const DefaultMaxAge = time.Second

// numShards splits the cache so that replicas' goroutines rarely contend.
const numShards = 64

// numEpochs is the number of slots of keys with an epoch each (see
// Cache.epochs).
const numEpochs = 4096

// Options configures a Cache. The zero value means the defaults.
type Options struct {
	// MaxEntries bounds the buckets remembered (rounded up to a multiple
	// of 64). When a shard is full, entries past their expiry are dropped
	// first, then arbitrary ones (forgetting only denies less). Default
	// DefaultMaxEntries.
	MaxEntries int
	// MaxBytes bounds the memory of the entries, in bytes, each counted as
	// its key's length plus EntryOverhead (rounded up to a multiple of
	// 64, split evenly over 64 shards: an entry that costs more than a
	// 64th is never remembered). Entries are dropped as for MaxEntries.
	// Default MaxEntries × BytesPerEntry.
	MaxBytes int64
	// MaxAge bounds how long after the call that learned it was sent a
	// denial is answered from the cache. Default DefaultMaxAge.
	MaxAge time.Duration
	// Now is the local clock, read when a call is sent to the store and
	// when a request is looked up. It must be monotonic (time.Now's
	// readings are). Default time.Now.
	Now func() time.Time
}

// Cache is a table of denials shared by a Learn layer (which fills it from
// the store's answers) and a Front layer (which answers from it). The zero
// Cache is not usable; call New. It is safe for concurrent use.
type Cache struct {
	now       func() time.Time
	base      time.Time // instants are kept as durations since base
	maxAge    time.Duration
	seed      maphash.Seed
	perShard  int
	shardCost int64 // bytes per shard
	shards    [numShards]shard
	// epochs count, per slot of keys (by hash), the refunds, admissions and
	// charges through this cache: a denial answered to a call sent in an
	// earlier epoch of its key's slot is not learned (the store may have
	// decided it before them). More slots than shards, so that spending on
	// other keys seldom keeps a denial from being learned.
	epochs [numEpochs]atomic.Uint64

	localDenials atomic.Int64
	learned      atomic.Int64
}

// shard is one lock and its part of the table, padded to its own cache
// lines.
type shard struct {
	mu sync.Mutex
	m  map[string]entry
	// cost is the sum of the entries' costs (see cost).
	cost int64
	// peak is the most entries m has held: a Go map keeps the room it
	// grew, so makeRoom makes a smaller one when it holds far fewer.
	peak int
	// nextSweep is the earliest expiry among the entries when last swept:
	// sweeping before it finds nothing to drop.
	nextSweep time.Duration
	_         [64]byte
}

// entry is what the store's denial of hits tokens, under limit, proved
// about a bucket. Instants are durations since Cache.base on the local
// clock.
//
// The bucket's TAT is at least reset − phase/Count µs for some phase in
// [phaseLo, phaseHi) ⊆ [0, Count); no request for hits tokens passes
// before until; the entry is not used at or after expires (≤ until). An
// entry learned from an ExceedsBurst denial has hits Burst+1 and tells only
// reset.
type entry struct {
	limit            limiter.Limit
	hits             int64
	expires, until   time.Duration
	reset            time.Duration
	phaseLo, phaseHi int64
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
	switch {
	case opts.MaxEntries < 0:
		return nil, fmt.Errorf("denialcache: Options.MaxEntries %d: must not be negative", opts.MaxEntries)
	case opts.MaxBytes < 0:
		return nil, fmt.Errorf("denialcache: Options.MaxBytes %d: must not be negative", opts.MaxBytes)
	case opts.MaxAge < 0:
		return nil, fmt.Errorf("denialcache: Options.MaxAge %v: must not be negative", opts.MaxAge)
	case opts.MaxEntries > MaxEntriesLimit:
		return nil, fmt.Errorf("denialcache: Options.MaxEntries %d: more than %d", opts.MaxEntries, MaxEntriesLimit)
	case opts.MaxBytes > MaxEntriesLimit*BytesPerEntry*16:
		return nil, fmt.Errorf("denialcache: Options.MaxBytes %d: more than %d", opts.MaxBytes, MaxEntriesLimit*BytesPerEntry*16)
	case opts.MaxAge > 24*time.Hour:
		return nil, fmt.Errorf("denialcache: Options.MaxAge %v: more than a day", opts.MaxAge)
	}
	if opts.MaxEntries == 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = int64(opts.MaxEntries) * BytesPerEntry
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Cache{
		now:       opts.Now,
		maxAge:    opts.MaxAge,
		seed:      maphash.MakeSeed(),
		perShard:  (opts.MaxEntries + numShards - 1) / numShards,
		shardCost: (opts.MaxBytes + numShards - 1) / numShards,
	}
	c.base = c.now()
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

// Learn returns a limiter.Store that passes every Take to store,
// remembers the denials it answers to single requests, and forgets the
// buckets its Takes spend from. store must be the shared store itself,
// whose every answer is the bucket's: not a layer that answers from
// elsewhere when the store fails (failover's deny or local modes), or the
// cache would take those answers for the bucket's. The Store returned is a
// limiter.DeadlineTaker, whose TakeBy uses store's when store has one.
func (c *Cache) Learn(store limiter.Store) limiter.Store {
	return learner{c: c, store: store}
}

var _ limiter.DeadlineTaker = learner{}

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
	return l.TakeBy(ctx, time.Time{}, now, reqs)
}

// TakeBy implements limiter.DeadlineTaker: through the store's TakeBy when
// it has one, else through Take under ctx ending at by.
func (l learner) TakeBy(ctx context.Context, by, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	l.c.forgetOtherLimits(reqs)
	if len(reqs) != 1 || !cacheable(reqs[0]) {
		d, err := limiter.TakeBy(l.store, ctx, by, now, reqs)
		if err == nil {
			l.c.forgetSpent(reqs, d)
		}
		return d, err
	}
	sh, ep := l.c.ref(reqs[0].Key)
	epoch := ep.Load()
	sent := l.c.since()
	d, err := limiter.TakeBy(l.store, ctx, by, now, reqs)
	if err == nil && len(d) == 1 {
		l.c.learn(sh, ep, reqs[0], d[0], sent, epoch)
	}
	return d, err
}

// Refund implements limiter.Refunder: it passes the refund to the store,
// if that can take it, and forgets the buckets named.
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

// Refund implements limiter.Refunder: it passes the refund to next, if
// that can take it, and forgets the buckets named.
func (f front) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	return f.c.refund(ctx, now, reqs, f.next)
}

// refund passes the refund to next, then forgets the buckets reqs name and
// moves their shards to a new epoch, so that a denial answered to a Take
// sent before the refund returned (which the store may have decided before
// the refund) is not learned afterwards. Until the refund returns, the
// cache may still deny from what it knew: the refund has not happened yet.
func (c *Cache) refund(ctx context.Context, now time.Time, reqs []limiter.Request, next limiter.Store) error {
	refunder, ok := next.(limiter.Refunder)
	if !ok {
		c.invalidate(reqs)
		return fmt.Errorf("%w: the backend cannot give tokens back", limiter.ErrInvalidRequest)
	}
	err := refunder.Refund(ctx, now, reqs)
	// Even on an error: the refund may have reached the store.
	c.invalidate(reqs)
	return err
}

// invalidate forgets the buckets reqs name and starts a new epoch in their
// slots.
func (c *Cache) invalidate(reqs []limiter.Request) {
	for _, r := range reqs {
		c.forget(r.Key)
	}
}

// forgetOtherLimits forgets the buckets of reqs that the cache knows under
// another Limit, before reqs go to the store: a request under another rate
// than the one a bucket was written under rescales it, even when denied
// (limiter.State), so what was learned under the old one no longer holds.
func (c *Cache) forgetOtherLimits(reqs []limiter.Request) {
	for _, r := range reqs {
		sh, ep := c.ref(r.Key)
		sh.mu.Lock()
		e, ok := sh.m[r.Key]
		sh.mu.Unlock()
		if ok && e.limit != r.Limit {
			sh.forget(ep, r.Key)
		}
	}
}

// forget forgets key's bucket and starts a new epoch in its slot, so that a
// denial already on its way is not learned either.
func (c *Cache) forget(key string) {
	sh, ep := c.ref(key)
	sh.forget(ep, key)
}

// forget forgets key's bucket, in sh, and starts a new epoch ep in its slot.
func (sh *shard) forget(ep *atomic.Uint64, key string) {
	sh.mu.Lock()
	ep.Add(1)
	sh.remove(key)
	sh.mu.Unlock()
}

// forgetSpent forgets the buckets of the requests that changed their
// bucket (admitted with Hits, or a post-paid charge): the cache's answers
// for them would be short by what was spent.
func (c *Cache) forgetSpent(reqs []limiter.Request, d []limiter.Decision) {
	for i, r := range reqs {
		if i < len(d) && (r.Charge() || d[i].Allowed && r.Hits > 0) {
			c.forget(r.Key)
		}
	}
}

func (c *Cache) shard(key string) *shard {
	return &c.shards[maphash.String(c.seed, key)%numShards]
}

// ref returns key's shard and its slot's epoch.
func (c *Cache) ref(key string) (*shard, *atomic.Uint64) {
	h := maphash.String(c.seed, key)
	return &c.shards[h%numShards], &c.epochs[h/numShards%numEpochs]
}

// since reads the clock, as a duration since c.base.
func (c *Cache) since() time.Duration {
	return c.now().Sub(c.base)
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
	now := c.since()
	if now >= e.expires {
		sh.mu.Lock()
		if e, ok := sh.m[r.Key]; ok && now >= e.expires {
			sh.remove(r.Key)
		}
		sh.mu.Unlock()
		return limiter.Decision{}, false
	}
	if e.limit != r.Limit || r.Hits < e.hits {
		return limiter.Decision{}, false
	}
	if r.Hits > r.Limit.Burst {
		c.localDenials.Add(1)
		return limiter.Decision{ResetAfter: ceilPositive(e.reset - now), ExceedsBurst: true}, true
	}
	at, ok := e.deadline(r.Hits)
	if !ok {
		return limiter.Decision{}, false
	}
	c.localDenials.Add(1)
	return limiter.Decision{RetryAfter: ceilPositive(at - now), ResetAfter: ceilPositive(e.reset - now)}, true
}

// deadline returns the instant before which m tokens (e.hits ≤ m ≤ Burst)
// cannot have arrived, as limiter.Decide computes it for the TAT e knows,
// and false if that depends on the part of the phase e does not know.
//
// In Decide's terms, the request is denied until TAT + Span(m) − FillTime,
// which is TAT − Span(Burst−m) (us µs plus frac/Count). With TAT = reset −
// phase/Count µs, that is reset − us − (1 if phase+frac ≥ Count), in whole
// microseconds: the store reads its clock to the microsecond.
func (e *entry) deadline(m int64) (time.Duration, bool) {
	if m == e.hits {
		return e.until, true
	}
	us, frac := e.limit.Span(e.limit.Burst - m)
	carry := int64(0)
	if frac > 0 {
		switch k := e.limit.Count - frac; {
		case e.phaseLo >= k:
			carry = 1
		case e.phaseHi > k:
			return 0, false
		}
	}
	return e.reset - time.Duration(us+carry)*time.Microsecond, true
}

// ceilPositive rounds d up to the microsecond; 0 if it is not positive.
func ceilPositive(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return (d + time.Microsecond - 1).Truncate(time.Microsecond)
}

// learn records the store's decision d on r, a call sent at sent (since
// c.base) in epoch epoch of r.Key's slot. sh and ep are r.Key's shard and
// slot epoch.
func (c *Cache) learn(sh *shard, ep *atomic.Uint64, r limiter.Request, d limiter.Decision, sent time.Duration, epoch uint64) {
	var e entry
	switch {
	case d.Allowed:
		// The admission spent tokens: an entry, or a denial decided before
		// it and still on its way, would answer short.
		sh.forget(ep, r.Key)
		return
	case d.ExceedsBurst:
		e = entry{limit: r.Limit, hits: r.Limit.Burst + 1, expires: sent + c.maxAge, reset: sent + d.ResetAfter}
		e.until = e.expires
	case d.RetryAfter > 0:
		lo, hi, ok := phase(r.Limit, r.Hits, d)
		if !ok {
			return
		}
		until := sent + d.RetryAfter
		e = entry{
			limit: r.Limit, hits: r.Hits,
			expires: min(until, sent+c.maxAge), until: until,
			reset: sent + d.ResetAfter, phaseLo: lo, phaseHi: hi,
		}
	default:
		return
	}
	cost := cost(r.Key)
	if cost > c.shardCost {
		return
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ep.Load() != epoch {
		// A refund, admission or charge returned since the call was sent:
		// the store may have decided before it.
		return
	}
	c.learned.Add(1)
	if _, ok := sh.m[r.Key]; ok {
		sh.m[r.Key] = e
	} else {
		if len(sh.m) >= c.perShard || sh.cost+cost > c.shardCost {
			sh.makeRoom(c.since(), c.perShard, c.shardCost-cost)
		}
		// The request's key may live in a buffer its caller reuses.
		sh.m[strings.Clone(r.Key)] = e
		sh.cost += cost
		sh.peak = max(sh.peak, len(sh.m))
	}
	if e.expires < sh.nextSweep {
		sh.nextSweep = e.expires
	}
}

// phase returns what the store's denial d of hits tokens under l tells of
// the bucket's phase (see entry): [lo, hi) ⊆ [0, Count). It reports false
// if d does not fit limiter.Decide's arithmetic for l and hits, so that
// the cache cannot tell what the store would answer.
//
// Decide answers ResetAfter = ⌈TAT − now⌉ and RetryAfter = ⌈TAT − now −
// Span(Burst−hits)⌉; with TAT − now = ResetAfter − phase/Count µs and
// Span(Burst−hits) = us + frac/Count µs, RetryAfter = ResetAfter − us −
// carry, where carry is 1 exactly when phase + frac ≥ Count.
func phase(l limiter.Limit, hits int64, d limiter.Decision) (lo, hi int64, ok bool) {
	if hits > l.Burst || d.RetryAfter%time.Microsecond != 0 || d.ResetAfter%time.Microsecond != 0 {
		return 0, 0, false
	}
	us, frac := l.Span(l.Burst - hits)
	switch carry := (d.ResetAfter - d.RetryAfter).Microseconds() - us; {
	case carry == 0 && frac == 0:
		return 0, l.Count, true
	case carry == 0:
		return 0, l.Count - frac, true
	case carry == 1 && frac > 0:
		return l.Count - frac, l.Count, true
	}
	return 0, 0, false
}

// cost is what an entry for key counts against Options.MaxBytes.
func cost(key string) int64 {
	return int64(len(key)) + EntryOverhead
}

// remove drops key's entry, if any. sh.mu is held.
func (sh *shard) remove(key string) {
	if _, ok := sh.m[key]; ok {
		delete(sh.m, key)
		sh.cost -= cost(key)
	}
}

// makeRoom drops entries from a shard until it holds fewer than maxLen
// and they cost at most maxCost: the entries past their expiry first (at
// most one sweep per earliest expiry), then arbitrary ones. It then moves
// them to a new map if they are a quarter of the peak or fewer (after
// short keys gave way to long ones), so that the map's room stays in
// proportion to the entries, which MaxBytes bounds. sh.mu is held.
func (sh *shard) makeRoom(now time.Duration, maxLen int, maxCost int64) {
	defer sh.compact()
	if now >= sh.nextSweep {
		next := time.Duration(1<<63 - 1)
		for k, e := range sh.m {
			if now >= e.expires {
				delete(sh.m, k)
				sh.cost -= cost(k)
			} else if e.expires < next {
				next = e.expires
			}
		}
		sh.nextSweep = next
	}
	for k := range sh.m {
		if len(sh.m) < maxLen && sh.cost <= maxCost {
			return
		}
		delete(sh.m, k)
		sh.cost -= cost(k)
	}
}

// compact moves the entries to a map of their size when they are a
// quarter of the peak or fewer. sh.mu is held.
func (sh *shard) compact() {
	if len(sh.m) > sh.peak/4 {
		return
	}
	m := make(map[string]entry, len(sh.m))
	for k, e := range sh.m {
		m[k] = e
	}
	sh.m, sh.peak = m, len(m)
}
