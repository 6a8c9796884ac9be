package failover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// fallback answers reqs per the failure mode, given the outage as the
// call found it and why it is answered so.
func (s *Store) fallback(ctx context.Context, now time.Time, reqs []limiter.Request, o outage, cause limiter.Fallback) ([]limiter.Decision, error) {
	s.noteFallback(cause)
	d, err := s.fallbackDecisions(ctx, now, reqs, o)
	for i := range d {
		d[i].Fallback = cause
	}
	return d, err
}

// fallbackDecisions are the failure mode's answers to reqs.
func (s *Store) fallbackDecisions(ctx context.Context, now time.Time, reqs []limiter.Request, o outage) ([]limiter.Decision, error) {
	t := s.opts.Now()
	mode := s.mode(o)
	if mode == Local {
		s.mu.Lock()
		s.lastLocal = latest(s.lastLocal, t)
		s.mu.Unlock()
	}
	switch mode {
	case Allow:
		d := make([]limiter.Decision, len(reqs))
		for i, r := range reqs {
			d[i] = limiter.Decision{Allowed: true, Remaining: max(0, r.Limit.Burst-r.Hits)}
		}
		return d, nil
	case Deny:
		retry := max(time.Second, o.openUntil.Sub(t))
		d := make([]limiter.Decision, len(reqs))
		for i := range reqs {
			d[i] = limiter.Decision{RetryAfter: retry}
		}
		return d, nil
	case Local:
		d, err := s.local.Take(ctx, now, s.shares(reqs))
		if err != nil {
			return nil, fmt.Errorf("local buckets: %w", err)
		}
		return d, nil
	}
	return nil, errorOf(o)
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// shares returns reqs with each Limit replaced by this replica's share.
func (s *Store) shares(reqs []limiter.Request) []limiter.Request {
	local := make([]limiter.Request, len(reqs))
	for i, r := range reqs {
		r.Limit = s.share(r.Limit)
		local[i] = r
	}
	return local
}

// share is this replica's part of l in Local mode: count, burst and max
// debt divided by ReplicasHint, rounded down but at least one token (a
// post-paid limit stays post-paid). The rounding can make the share fill
// slower than l (a count of 2n−1 rounds down to 1 while the burst halves
// less), so far that it would fill in more than limiter.MaxFill; the share
// is then cut to the largest burst (then max debt) that fits, and if even
// one token does not fit, given the smallest count that does (never more
// than l's). A valid l always gives a valid share.
func (s *Store) share(l limiter.Limit) limiter.Limit {
	n := s.opts.ReplicasHint
	sh := limiter.Limit{Count: max(1, l.Count/n), Period: l.Period, Burst: max(1, l.Burst/n)}
	if l.MaxDebt > 0 {
		sh.MaxDebt = max(1, l.MaxDebt/n)
	}
	if sh.Validate() == nil {
		return sh
	}
	minDebt := min(sh.MaxDebt, 1)
	valid := func(count, burst, debt int64) bool {
		return limiter.Limit{Count: count, Period: l.Period, Burst: burst, MaxDebt: debt}.Validate() == nil
	}
	// l.Count fits, since l fills in MaxFill with at least as many tokens.
	sh.Count = search(sh.Count, l.Count, func(c int64) bool { return valid(c, 1, minDebt) })
	sh.Burst = search(1, sh.Burst+1, func(b int64) bool { return !valid(sh.Count, b, minDebt) }) - 1
	sh.MaxDebt = search(minDebt, sh.MaxDebt+1, func(d int64) bool { return !valid(sh.Count, sh.Burst, d) }) - 1
	return sh
}

// search returns the smallest v in [lo, hi) for which f is true, or hi if
// there is none, given that f is monotonic (false, then true).
func search(lo, hi int64, f func(int64) bool) int64 {
	for lo < hi {
		mid := lo + (hi-lo)/2
		if f(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// resetSlack is how close to its deadline a caller's context may be
// cancelled and still count as having run out of time: a gRPC client
// whose deadline passes resets the stream, which the server sees as a
// cancellation shortly before its own copy of the deadline (computed from
// the grpc-timeout header on arrival) passes.
const resetSlack = 5 * time.Millisecond

// gaveUp is the error of a call whose caller stopped waiting (ctx is
// done) before err, the backend's, could be answered per the failure
// mode: context.Canceled only if the caller cancelled with time left; a
// context cancelled at its deadline (a gRPC stream reset by a client
// whose deadline passed) or past it is context.DeadlineExceeded, so that
// the call is not reported as cancelled by its caller (gRPC CANCELED).
// Either way err is kept as text, and the error wraps
// limiter.ErrOverloaded if err did, else limiter.ErrUnavailable.
func gaveUp(ctx context.Context, err error) error {
	kind := limiter.ErrUnavailable
	if errors.Is(err, limiter.ErrOverloaded) {
		kind = limiter.ErrOverloaded
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > resetSlack {
			return fmt.Errorf("the caller gave up: %w: %w (%v)", context.Canceled, kind, err)
		}
	}
	return fmt.Errorf("the caller's deadline passed: %w: %w (%v)", context.DeadlineExceeded, kind, err)
}
