// Package tokenlease serves a busy bucket's takes from slices of its
// tokens: a replica that sees a bucket busy takes a slice of its tokens from
// the store in one atomic take (spent there, so the bound every replica
// shares, admitted ≤ rate·t + burst, holds by construction) and admits from
// the slice locally, giving back what is left when the slice ends. A hot
// bucket then costs the store one take a slice rather than one a request.
//
// A slice is a reservation (limiter.Request.MaxWait = Options.Hold): on a
// bucket with tokens it is there at once; on a bucket that demand keeps
// empty (the hot bucket of an overloaded fleet) its tokens are the next
// ones to arrive, each admitted here only once the store's schedule says
// it has arrived (the k-th last at the reservation's end less the time of
// k tokens, rounded late), so a fleet of slices admits what arrives, in
// time, and never earlier.
//
// The rules, and why:
//   - Only takes lease: Hits > 0, no MaxWait, no MaxDebt, not Shadow.
//     Checks, reservations, post-paid charges and Shadow requests need the
//     bucket's own state and go to the store.
//   - A bucket is busy when this replica saw at least Options.Busy hits a
//     second on it over the last Options.Hold. Its slice is what the local
//     demand needs for the slice's life, at most Burst/Options.ShareDivisor
//     (a small share, so that replicas sharing a bucket still find tokens:
//     with 16 replicas each holding a slice, at most a burst is held), and
//     at least 2 tokens (else there is nothing to save).
//   - A slice lives one Hold; each slice the store grants at once while
//     the bucket keeps ShareDivisor times the next one's tokens makes the
//     next live twice as long, up to Options.MaxLives Holds (a bucket with
//     that much to spare loses nothing to it, and the store sees fewer
//     calls); any other answer brings it back to one Hold.
//   - Once what a slice holds would last under half a Hold, the next slice
//     is fetched on a goroutine of its own and joins it (see refill): no
//     request waits for a fetch or goes to the store alone meanwhile.
//   - A slice ends when its life is over or half a Hold after its last
//     token arrives, whichever is later; when it runs out; when its rule's
//     limit changes; and at Close. What is left is given back to the store
//     (Refund, queued: no caller waits for it), which moves the bucket's
//     TAT back by those tokens. So a token spent in the store and not
//     admitted here is held at most a Hold and a half on a scarce bucket
//     (MaxLives Holds on one with plenty to spare): the cost of leasing is
//     that other replicas may be denied, for that long, tokens a slice
//     holds.
//   - A Take of several requests takes what it can from live slices and
//     the rest from the store; if the store denies, the slices get their
//     tokens back (all-or-nothing holds), and the locally served requests
//     answer as a check would.
//   - While the store fails, live slices keep answering; then the failure
//     mode answers (a fallback answer never fills a slice).
//   - An answer from a slice reports as Remaining the tokens left in the
//     store when the slice was taken plus what the slice still holds, and
//     as ResetAfter the store's at that moment less the time since: the
//     bucket as last known, not as other replicas have changed it since.
//
// A Leaser is safe for concurrent use.
package tokenlease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Defaults of Options.
const (
	DefaultHold         = 20 * time.Millisecond
	DefaultBusy         = 500 // hits a second
	DefaultShareDivisor = 16
	DefaultMaxLives     = 16 // Holds
	DefaultMaxBuckets   = 10000
	giveBackTimeout     = time.Second
	minSlice            = 2
	idleWindowsToForget = 4
)

// Options configures a Leaser. The zero value means the defaults.
type Options struct {
	// Now is the local clock of slices and demand (default time.Now).
	Now func() time.Time
	// Hold is how long a slice lives, and the window over which demand is
	// measured (default 20 ms).
	Hold time.Duration
	// Busy is the hits a second on a bucket, seen by this replica, from
	// which it leases (default 500).
	Busy float64
	// ShareDivisor bounds a slice to Burst/ShareDivisor tokens (default 16).
	ShareDivisor int64
	// MaxLives bounds how many Holds a slice may live, and so be sized
	// for, while the store has plenty of tokens (default 16; 1 keeps
	// every slice to one Hold). See the package doc.
	MaxLives int64
	// MaxBuckets bounds the buckets whose demand is tracked (default
	// 10,000); beyond, new buckets go to the store without leasing.
	MaxBuckets int
}

// Stats counts what a Leaser did.
type Stats struct {
	Local    int64 // requests admitted from a slice
	Slices   int64 // slices taken from the store
	Taken    int64 // tokens taken into slices
	Returned int64 // tokens given back
	Held     int64 // tokens held in live slices now
	// LocalDenials counts requests denied here because the slice's next
	// tokens had not arrived yet.
	LocalDenials int64
	// Dropped counts give-backs that failed or found the queue full: their
	// tokens stay spent.
	Dropped int64
}

// Leaser is a limiter.Store in front of another that leases busy buckets.
type Leaser struct {
	store limiter.Store
	opts  Options

	mu      sync.Mutex
	buckets map[string]*bucket
	stats   Stats
	closed  bool // Close has begun: no slice is filled or refilled any more
	// draining: the returner has stopped taking give-backs from the queue
	// (Close): giveBack refunds them itself
	draining bool

	// refills counts the refills under way (see refill), which Close
	// waits for
	refills sync.WaitGroup

	// returns queues give-backs for the returner goroutine: a caller never
	// waits for one (a Redis that hangs must not hold a request)
	returns   chan []limiter.Request
	stop      chan struct{}
	done      chan struct{}
	returned  chan struct{}
	closeOnce sync.Once
}

// returnQueue bounds the give-backs waiting for the store: beyond, one is
// dropped, its tokens left spent (stricter, never looser), and counted.
const returnQueue = 1024

// bucket is what a Leaser knows of one bucket: its demand and its slice.
type bucket struct {
	limit limiter.Limit
	// demand: hits seen in the window that started at windowAt, and in
	// the one before it
	windowAt     time.Time
	hits, before int64
	// the slice: tokens of it not yet admitted, the last of which arrives
	// at full, until until; fetching while a call takes one from the store
	// (the others meanwhile go to the store alone)
	fetching bool
	// noSliceUntil: the store denied a slice (its tokens would not all
	// arrive within a Hold); until then, requests go to it alone
	noSliceUntil time.Time
	// lives: how many Holds the next slice lives, and is sized for (0
	// means 1): doubled, up to MaxLives, by each slice the store grants at
	// once with plenty left; back to 1 by any other answer
	lives    int64
	tokens   int64
	full     time.Time
	until    time.Time
	takenAt  time.Time
	remStore int64         // the store's Remaining when the slice was taken
	reset    time.Duration // the store's ResetAfter then
}

// arrival is when the next n tokens of b's slice have all arrived: the
// slice's last token arrives at full, and the one k before it the time of
// k tokens earlier (Limit.TimeFor rounds that down to the µs: late, never
// early).
func (b *bucket) arrival(n int64) time.Time {
	return b.full.Add(-b.limit.TimeFor(b.tokens - n))
}

// New returns a Leaser in front of store, which must also be a
// limiter.Refunder (slices are given back). It runs a goroutine that ends
// slices; Close stops it.
func New(store limiter.Store, opts Options) (*Leaser, error) {
	if _, ok := store.(limiter.Refunder); !ok {
		return nil, errors.New("tokenlease: the store cannot give tokens back (limiter.Refunder)")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Hold == 0 {
		opts.Hold = DefaultHold
	}
	if opts.Busy == 0 {
		opts.Busy = DefaultBusy
	}
	if opts.ShareDivisor == 0 {
		opts.ShareDivisor = DefaultShareDivisor
	}
	if opts.MaxLives == 0 {
		opts.MaxLives = DefaultMaxLives
	}
	if opts.MaxBuckets == 0 {
		opts.MaxBuckets = DefaultMaxBuckets
	}
	if opts.Hold < 0 || opts.Busy < 0 || opts.ShareDivisor < 1 || opts.MaxBuckets < 0 || opts.MaxLives < 1 {
		return nil, fmt.Errorf("tokenlease: invalid options %+v", opts)
	}
	l := &Leaser{store: store, opts: opts, buckets: make(map[string]*bucket),
		returns: make(chan []limiter.Request, returnQueue), stop: make(chan struct{}), done: make(chan struct{}), returned: make(chan struct{})}
	go l.run()
	go l.returner()
	return l, nil
}

// Stats returns the counts so far.
func (l *Leaser) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

// leasable reports whether r may be served from a slice.
func leasable(r limiter.Request) bool {
	return r.Hits > 0 && r.MaxWait == 0 && r.Limit.MaxDebt == 0 && !r.Shadow
}

// Take implements limiter.Store.
func (l *Leaser) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	return l.TakeBy(ctx, time.Time{}, now, reqs)
}

// TakeBy implements limiter.DeadlineTaker.
func (l *Leaser) TakeBy(ctx context.Context, by, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	local := l.opts.Now()
	var ended []limiter.Request // slices to give back
	served := make([]bool, len(reqs))
	decisions := make([]limiter.Decision, len(reqs))
	var fetch *limiter.Request // one busy bucket of a single-request Take: fetch its slice
	var refills []limiter.Request
	l.mu.Lock()
	for i, r := range reqs {
		if !leasable(r) {
			continue
		}
		b := l.bucketOf(r, local, &ended)
		if b == nil {
			continue
		}
		b.hits += r.Hits
		switch d, outcome := l.serve(b, r, local); {
		case outcome == admitted:
			served[i], decisions[i] = true, d
			if next := l.refill(b, r, local); next != nil {
				refills = append(refills, *next)
			}
			continue
		case outcome == notArrived && len(reqs) == 1:
			l.mu.Unlock()
			l.giveBack(ended)
			return []limiter.Decision{d}, nil
		case outcome == notArrived:
			continue // a Take of several: the store decides this one
		}
		if len(reqs) == 1 && !l.closed && b.tokens == 0 && !b.fetching && !local.Before(b.noSliceUntil) {
			if size := l.sliceSize(b, r); size > 0 {
				fetch = &limiter.Request{Key: r.Key, Limit: r.Limit, Hits: size, MaxWait: l.opts.Hold}
				b.fetching = true
			}
		}
	}
	for _, r := range refills {
		l.refills.Add(1)
		go l.fetchRefill(r)
	}
	l.mu.Unlock()
	l.giveBack(ended)

	var rest []limiter.Request
	var at []int
	for i, r := range reqs {
		if !served[i] {
			rest, at = append(rest, r), append(at, i)
		}
	}
	if len(rest) == 0 {
		return decisions, nil
	}
	if fetch != nil {
		ok, fallback, err := l.fetch(ctx, by, now, *fetch)
		if err != nil {
			return nil, err
		}
		if fallback != nil {
			// the failure mode's answer for the bucket is the request's: a
			// second call would only spend the rest of its deadline
			return []limiter.Decision{*fallback}, nil
		}
		if ok { // served from the new slice, or denied until its tokens arrive
			l.mu.Lock()
			var d limiter.Decision
			outcome := noSlice
			if b, ok := l.buckets[reqs[0].Key]; ok && b.limit == reqs[0].Limit {
				d, outcome = l.serve(b, reqs[0], l.opts.Now())
			}
			l.mu.Unlock()
			if outcome != noSlice {
				return []limiter.Decision{d}, nil
			}
		}
	}
	got, err := limiter.TakeBy(l.store, ctx, by, now, rest)
	admitted := err == nil
	for j := range got {
		if !got[j].Allowed && !rest[j].Shadow {
			admitted = false
		}
	}
	if len(rest) < len(reqs) && !admitted {
		// All-or-nothing: what the slices served goes back to them; those
		// requests answer as a check would, admitted (DecideDenied).
		l.restore(reqs, served, local)
	}
	if err != nil {
		return nil, err
	}
	for j, i := range at {
		decisions[i] = got[j]
	}
	return decisions, nil
}

// What serve did with a request.
const (
	noSlice    = iota // no slice, or too few tokens left in it: the store decides
	admitted          // admitted from the slice
	notArrived        // denied: the slice's next tokens have not arrived yet
)

// serve takes r's hits from b's slice at local if it holds them and they
// have arrived; if they have not, the answer is the denial the store would
// give. l.mu is held.
func (l *Leaser) serve(b *bucket, r limiter.Request, local time.Time) (limiter.Decision, int) {
	if b.tokens < r.Hits || !local.Before(b.until) {
		return limiter.Decision{}, noSlice
	}
	if at := b.arrival(r.Hits); local.Before(at) {
		l.stats.LocalDenials++
		return limiter.Decision{RetryAfter: at.Sub(local), ResetAfter: max(0, b.reset-local.Sub(b.takenAt))}, notArrived
	}
	b.tokens -= r.Hits
	l.stats.Local++
	l.stats.Held -= r.Hits
	return b.answer(local), admitted
}

// bucketOf returns the bucket of r, made if there is room (nil if not),
// with its demand window moved to local; a slice under another limit, or
// past its time, ends (its tokens go to ended). l.mu is held.
func (l *Leaser) bucketOf(r limiter.Request, local time.Time, ended *[]limiter.Request) *bucket {
	b, ok := l.buckets[r.Key]
	if !ok {
		if len(l.buckets) >= l.opts.MaxBuckets {
			return nil
		}
		b = &bucket{limit: r.Limit, windowAt: local}
		l.buckets[r.Key] = b
	}
	if b.limit != r.Limit || !local.Before(b.until) {
		l.end(r.Key, b, ended)
		b.limit = r.Limit
	}
	if d := local.Sub(b.windowAt); d >= l.opts.Hold {
		b.before = b.hits
		if d >= 2*l.opts.Hold {
			b.before = 0
		}
		b.hits, b.windowAt = 0, local
	}
	return b
}

// end ends b's slice, adding what it holds to ended. l.mu is held.
func (l *Leaser) end(key string, b *bucket, ended *[]limiter.Request) {
	if b.tokens > 0 {
		*ended = append(*ended, limiter.Request{Key: key, Limit: b.limit, Hits: b.tokens})
		l.stats.Held -= b.tokens
		l.stats.Returned += b.tokens
	}
	b.tokens, b.until = 0, time.Time{}
}

// answer is a request's Decision from b's slice at local.
func (b *bucket) answer(local time.Time) limiter.Decision {
	return limiter.Decision{
		Allowed:    true,
		Remaining:  b.remStore + b.tokens,
		ResetAfter: max(0, b.reset-local.Sub(b.takenAt)),
	}
}

// restore gives the tokens that served reqs (served[i]) back to their
// slices, when the Take they were part of was denied. The slice may have
// ended meanwhile: they then go back to the store.
func (l *Leaser) restore(reqs []limiter.Request, served []bool, local time.Time) {
	var ended []limiter.Request
	l.mu.Lock()
	for i, r := range reqs {
		if !served[i] {
			continue
		}
		l.stats.Local--
		if b, ok := l.buckets[r.Key]; ok && b.limit == r.Limit && local.Before(b.until) {
			b.tokens += r.Hits
			l.stats.Held += r.Hits
			continue
		}
		ended = append(ended, limiter.Request{Key: r.Key, Limit: r.Limit, Hits: r.Hits})
		l.stats.Returned += r.Hits
	}
	l.mu.Unlock()
	l.giveBack(ended)
}

// run ends the slices past their time, every quarter Hold, and forgets buckets
// idle for idleWindowsToForget windows.
func (l *Leaser) run() {
	defer close(l.done)
	t := time.NewTicker(l.opts.Hold / 4)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.sweep(l.opts.Now())
	}
}

// sweep ends every slice past its time at local and forgets idle buckets.
func (l *Leaser) sweep(local time.Time) {
	var ended []limiter.Request
	l.mu.Lock()
	for key, b := range l.buckets {
		if !local.Before(b.until) {
			l.end(key, b, &ended)
		}
		if b.tokens == 0 && local.Sub(b.windowAt) >= idleWindowsToForget*l.opts.Hold {
			delete(l.buckets, key)
		}
	}
	l.mu.Unlock()
	l.giveBack(ended)
}

// Close ends every slice, giving back what it holds, and stops the
// Leaser's goroutines; a second Close does nothing more. It is meant for
// shutdown: Takes after it go to the store without leasing, and a Take in
// flight at Close gives what it took from a slice back to the store
// itself (see giveBack).
func (l *Leaser) Close() error {
	l.closeOnce.Do(func() {
		var ended []limiter.Request
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
		l.refills.Wait() // none starts once closed
		l.mu.Lock()
		for key, b := range l.buckets {
			l.end(key, b, &ended)
		}
		l.buckets = make(map[string]*bucket)
		l.mu.Unlock()
		if len(ended) > 0 {
			l.refund(ended)
		}
		close(l.stop)
	})
	<-l.done
	<-l.returned
	return nil
}

// Refund implements limiter.Refunder: the store's.
func (l *Leaser) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	return l.store.(limiter.Refunder).Refund(ctx, now, reqs)
}
