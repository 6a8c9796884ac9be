package tokenlease

import (
	"context"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// sliceSize is the slice to take for r's bucket b: the demand of one Hold
// (the hits of the last full window, or of this one so far, whichever is
// more) for each Hold the slice will live (b.lives), at most
// Burst/ShareDivisor and Burst − r.Hits; 0 if b is not busy or the slice
// would be under minSlice. l.mu is held.
func (l *Leaser) sliceSize(b *bucket, r limiter.Request) int64 {
	demand := max(b.before, b.hits)
	if float64(demand) < l.opts.Busy*l.opts.Hold.Seconds() {
		return 0
	}
	size := min(demand*max(b.lives, 1), r.Limit.Burst/l.opts.ShareDivisor, r.Limit.Burst-r.Hits)
	if size < minSlice {
		return 0
	}
	return size
}

// refill is the fetch of b's next slice, made while this one still
// holds tokens so that no request waits for it, or goes to the store
// alone meanwhile (a hot bucket's requests would otherwise reach the store
// by the dozen during each fetch): once what is left would last under
// half a Hold at the demand seen, or is under half a slice (when the share
// cap keeps slices smaller than a Hold's demand; else every admission
// would fetch a few tokens). It tops the slice up to sliceSize's size:
// this replica then holds what its demand needs, within the share cap,
// and a slice of a bucket that demand keeps empty asks only for tokens
// that arrive within a Hold (a whole slice more would not, and be
// refused). nil when a fetch is under way, the store refused a slice
// lately, b is no longer busy, the top-up would be under minSlice, or the
// Leaser is closing. It marks b fetching. l.mu is held.
func (l *Leaser) refill(b *bucket, r limiter.Request, local time.Time) *limiter.Request {
	if l.closed || b.fetching || local.Before(b.noSliceUntil) {
		return nil
	}
	full := l.sliceSize(b, r)
	if demand := max(b.before, b.hits); 2*b.tokens > min(demand, full) {
		return nil
	}
	size := full - b.tokens
	if size < minSlice {
		return nil
	}
	b.fetching = true
	return &limiter.Request{Key: r.Key, Limit: r.Limit, Hits: size, MaxWait: l.opts.Hold}
}

// fetchRefill fetches a refill (see refill) on its own goroutine, within
// giveBackTimeout: no request waits for it.
func (l *Leaser) fetchRefill(r limiter.Request) {
	defer l.refills.Done()
	ctx, cancel := context.WithTimeout(context.Background(), giveBackTimeout)
	defer cancel()
	l.fetch(ctx, time.Time{}, l.opts.Now(), r)
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fetch takes the slice r (its size, reserved within a Hold) from the
// store, and reports whether it is now r's bucket's. A denial (the slice
// would not arrive within a Hold) or an answer for a bucket forgotten or
// changed meanwhile fills no slice (what it took goes back); a fallback
// answer (the store failing) fills none either, and is returned: it is the
// failure mode's answer for the bucket.
func (l *Leaser) fetch(ctx context.Context, by, now time.Time, r limiter.Request) (bool, *limiter.Decision, error) {
	got, err := limiter.TakeBy(l.store, ctx, by, now, []limiter.Request{r})
	if err == nil && got[0].Fallback != limiter.FallbackNone {
		l.mu.Lock()
		if b, ok := l.buckets[r.Key]; ok {
			b.fetching = false
		}
		l.mu.Unlock()
		d := got[0]
		d.Wait = 0
		return false, &d, nil
	}
	// Arrivals are counted from the answer, after Redis decided: late,
	// never early.
	local := l.opts.Now()
	filled := err == nil && got[0].Allowed // a fallback answer returned above
	var ended []limiter.Request
	l.mu.Lock()
	b, ok := l.buckets[r.Key]
	if ok {
		b.fetching = false
	}
	kept := false
	switch {
	case !filled:
		if ok {
			b.lives = 1
		}
		if ok && err == nil {
			b.noSliceUntil = local.Add(l.opts.Hold)
		}
	case ok && b.limit == r.Limit && !l.closed:
		if !local.Before(b.until) {
			l.end(r.Key, b, &ended)
		}
		d := got[0]
		full := local.Add(d.Wait)
		if b.tokens > 0 && b.full.After(local) {
			// A refill joins what is left of a slice whose tokens have not
			// all arrived (see refill). The slice's schedule (arrival)
			// puts the k-th token before the last at full less the time of
			// k tokens: with full no earlier than the old last token's
			// arrival plus the time of the new ones, each old token is
			// scheduled at or after its own arrival (TimeFor rounds each
			// span down by under a µs, hence the µs), and the new ones
			// after the old ones, as in the store's schedule. (Old tokens
			// that have all arrived may be scheduled anywhere before now.)
			full = later(full, b.full.Add(r.Limit.TimeFor(r.Hits)+time.Microsecond))
		}
		b.tokens += r.Hits
		b.full, b.takenAt = full, local
		// a slice is sized for b.lives Holds of demand, and lives that
		// long; a reservation's tokens, once arrived, wait here at most
		// half a Hold more: a replica that cannot use them (its demand
		// fell, or it is starved of CPU) gives them back for the others
		lives := max(b.lives, 1)
		b.until = later(b.until, later(b.full.Add(l.opts.Hold/2), local.Add(time.Duration(lives)*l.opts.Hold)))
		b.remStore, b.reset = d.Remaining, d.ResetAfter
		// The next slice lives twice as long, and is sized for it, if the
		// store granted this one at once and keeps ShareDivisor times the
		// next one's tokens: a bucket with that much to spare loses nothing
		// to a longer slice, and the store sees half the calls. Otherwise
		// (the bucket is scarce, or shared by busy replicas) one Hold.
		if d.Wait == 0 && d.Remaining >= 2*r.Hits*l.opts.ShareDivisor {
			b.lives = min(2*lives, l.opts.MaxLives)
		} else {
			b.lives = 1
		}
		l.stats.Slices++
		l.stats.Taken += r.Hits
		l.stats.Held += r.Hits
		kept = true
	default: // forgotten, changed, or closed meanwhile
		ended = append(ended, limiter.Request{Key: r.Key, Limit: r.Limit, Hits: r.Hits})
		l.stats.Taken += r.Hits
		l.stats.Returned += r.Hits
	}
	l.mu.Unlock()
	l.giveBack(ended)
	return kept, nil, err
}
