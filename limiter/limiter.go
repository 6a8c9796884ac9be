// Package limiter is the token-bucket model of ratelimitd: limits, the
// decision a bucket makes for a request, the exact integer arithmetic behind
// it, and the Store interface that keeps buckets (in memory or in Redis).
//
// A bucket holds up to Burst tokens and gains Count tokens every Period,
// smoothly (one token every Period/Count). A request for n tokens is admitted
// when the bucket holds at least n; it then spends them. The state of a bucket
// is one instant, its theoretical arrival time (TAT) in the terms of the
// generic cell rate algorithm (GCRA): the bucket is full at and after the TAT,
// and holds (Burst·Period/Count − (TAT − now))·Count/Period tokens before it.
// A bucket that is full needs no state at all, so stores drop it.
//
// Time is always an argument: nothing in this package reads the clock.
// The package uses only the standard library.
package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Limit is the shape of a token bucket. The zero Limit is invalid; call
// Validate before using a Limit built from untrusted input.
type Limit struct {
	// Count tokens are added to the bucket every Period.
	Count int64
	// Period is the refill period. Only whole microseconds count.
	Period time.Duration
	// Burst is the capacity of the bucket, in tokens: how many can be spent
	// at once after a quiet spell.
	Burst int64
	// MaxDebt, when positive, makes the bucket post-paid: a charge (Hits >
	// 0) is always recorded, even when it overdraws the bucket, down to
	// MaxDebt tokens below empty (a larger charge is recorded up to that
	// floor). A charge or a check is admitted only while the bucket is not
	// in debt. Zero means no overdraft.
	MaxDebt int64
}

// Bounds on a Limit that keep every value the Redis script (whose numbers
// are doubles) handles an exact integer below 2^53: spans in microseconds
// below 2·MaxFill plus now, fractions of a microsecond below Count. The
// Go arithmetic (span) forms the one product that could pass 2^63,
// n·(Period mod Count), in 128 bits, so Count·Burst is not bounded: a
// limit of 4294967295 per second with that burst is exact.
const (
	// MaxTokens bounds Count, Burst and MaxDebt.
	MaxTokens = 1 << 40
	// MaxFill bounds the time a bucket takes to fill from empty and, with
	// MaxDebt, to pay its deepest debt and fill: every span the arithmetic
	// forms (Burst+MaxDebt tokens at most) is then below 2^53 µs.
	MaxFill = 100 * 365 * 24 * time.Hour
)

// Validate reports whether l can be used, and why not. Besides the bounds
// on each field, it rejects every limit whose fill time (and, with MaxDebt,
// the time of Burst+MaxDebt tokens) exceeds MaxFill, checking before it
// multiplies, so that no limit it accepts overflows int64.
func (l Limit) Validate() error {
	switch {
	case l.Count < 1:
		return fmt.Errorf("count %d: must be at least 1", l.Count)
	case l.Count > MaxTokens:
		return fmt.Errorf("count %d: must be at most %d", l.Count, int64(MaxTokens))
	case l.Period < time.Microsecond:
		return fmt.Errorf("period %v: must be at least 1µs", l.Period)
	case l.Burst < 1:
		return fmt.Errorf("burst %d: must be at least 1", l.Burst)
	case l.Burst > MaxTokens:
		return fmt.Errorf("burst %d: must be at most %d", l.Burst, int64(MaxTokens))
	case l.MaxDebt < 0:
		return fmt.Errorf("max debt %d: must not be negative", l.MaxDebt)
	case l.MaxDebt > MaxTokens:
		return fmt.Errorf("max debt %d: must be at most %d", l.MaxDebt, int64(MaxTokens))
	}
	if !l.spanFits(l.Burst) {
		return fmt.Errorf("burst %d at %d per %v: the bucket would take %s to fill, more than %v",
			l.Burst, l.Count, l.Period, l.spanText(l.Burst), MaxFill)
	}
	if l.MaxDebt > 0 && !l.spanFits(l.Burst+l.MaxDebt) {
		return fmt.Errorf("burst %d and max debt %d at %d per %v: paying the debt and filling would take %s, more than %v",
			l.Burst, l.MaxDebt, l.Count, l.Period, l.spanText(l.Burst+l.MaxDebt), MaxFill)
	}
	return nil
}

// spanFits reports whether n tokens arrive within MaxFill, n·Period/Count ≤
// MaxFill, for 0 ≤ n ≤ Burst+MaxDebt and the bounds Validate checks first.
// span computes n·q with q = Period/Count, which may overflow int64, so
// that product is bounded first by division; the rest of the span, less
// than n+1 µs, cannot overflow then.
func (l Limit) spanFits(n int64) bool {
	maxUS := MaxFill.Microseconds()
	if q := l.Period.Microseconds() / l.Count; q > 0 && n > maxUS/q {
		return false
	}
	return l.span(n).us <= maxUS
}

// spanText gives n tokens' time, n·Period/Count, for an error message:
// exactly (rounded up to the microsecond) when it fits a time.Duration,
// else approximately, in years.
func (l Limit) spanText(n int64) string {
	const maxUS = math.MaxInt64 / int64(time.Microsecond)
	p := l.Period.Microseconds()
	// The span is under n·q + n + 1 µs (span), so this bound keeps it,
	// rounded up, within a Duration.
	if q := p / l.Count; q == 0 || n <= (maxUS-n-1)/q {
		return l.span(n).ceilDuration().String()
	}
	const yearUS = 365 * 24 * 3600 * 1e6
	return fmt.Sprintf("about %.3g years", float64(n)*float64(p)/float64(l.Count)/yearUS)
}

// FillTime is how long an empty bucket takes to fill: Burst·Period/Count,
// rounded up to the microsecond.
func (l Limit) FillTime() time.Duration {
	return l.fillTime().ceilDuration()
}

// TimeFor is how long n tokens take to arrive, n·Period/Count, rounded
// down to the microsecond; n is clamped to [0, Burst+MaxDebt].
func (l Limit) TimeFor(n int64) time.Duration {
	return time.Duration(l.span(min(max(n, 0), l.Burst+l.MaxDebt)).us) * time.Microsecond
}

// String gives the limit in the form "10/1m0s burst 20".
func (l Limit) String() string {
	return fmt.Sprintf("%d/%v burst %d", l.Count, l.Period, l.Burst)
}

// Request asks one bucket for tokens.
type Request struct {
	// Key names the bucket. Keys are opaque: any bytes.
	Key string
	// Limit is the bucket's shape. The state kept under Key does not
	// depend on it, so a changed Limit applies to an existing bucket.
	Limit Limit
	// Hits is how many tokens to take. Zero checks the bucket without
	// spending: it is admitted unless the bucket is in debt.
	Hits int64
	// MaxWait, when positive, lets a request that finds too few tokens
	// reserve them if they arrive within MaxWait: it is admitted with
	// Decision.Wait, the bucket goes into debt by the reservation, and the
	// caller must hold the request that long (or Refund it). Reservations
	// queue in arrival order.
	MaxWait time.Duration
	// Shadow requests are decided and charged like the others, but their
	// denial does not deny the Take (shadow-mode rules, which only report).
	Shadow bool
	// Counting says what a post-paid charge (Charge) records when its Take
	// is denied; the zero value, CountAlways, records it.
	Counting Counting
}

// Counting says whether a post-paid charge is recorded when its Take is
// denied.
type Counting uint8

const (
	// CountAlways records a charge whatever the other requests of its Take
	// decide (envoyproxy/ratelimit's INCRBY, which counts every hit).
	CountAlways Counting = iota
	// CountWhereDenied records a charge in a denied Take only when the
	// charge itself was denied (its bucket was in debt); one whose bucket
	// had room spends nothing, like any request of a denied Take
	// (envoyproxy/ratelimit with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT,
	// which stops counting the other descriptors of a request that is
	// over). A Take that is admitted records every charge either way.
	CountWhereDenied
)

// countingNames are the countings' names, as the docs give them.
var countingNames = [...]string{CountAlways: "always", CountWhereDenied: "where-denied"}

// String names the counting as the docs do.
func (c Counting) String() string {
	if int(c) < len(countingNames) {
		return countingNames[c]
	}
	return fmt.Sprintf("Counting(%d)", uint8(c))
}

// Charge reports whether r is a post-paid charge, which a Store records
// even when it overdraws, and, with CountAlways, whatever the other
// requests of the same Take decide.
func (r Request) Charge() bool { return r.Limit.MaxDebt > 0 && r.Hits > 0 }

// Decision is what a bucket answered to one Request.
type Decision struct {
	// Allowed reports whether the request was admitted.
	Allowed bool
	// Remaining is the number of whole tokens left in the bucket after the
	// request; 0 when it was denied.
	Remaining int64
	// RetryAfter is, for a denied request, how long until the same request
	// would be admitted (were nothing else spent meanwhile); 0 when allowed
	// and when ExceedsBurst.
	// It is rounded up to the microsecond.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again, rounded up to
	// the microsecond.
	ResetAfter time.Duration
	// ExceedsBurst reports that Hits is more than the bucket can ever hold:
	// the request is denied and retrying cannot help.
	ExceedsBurst bool
	// Fallback is FallbackNone when the bucket decided. Otherwise no bucket
	// did: a store answered by its policy for when its backend cannot
	// decide in time (a failure mode), and Fallback says why. (Beside
	// ExceedsBurst, so that a Decision stays 48 bytes.)
	Fallback Fallback
	// Wait, when positive, says the request was admitted by reserving
	// tokens that arrive only after Wait (see Request.MaxWait). Rounded up
	// to the microsecond.
	Wait time.Duration
}

// Fallback says why a store answered without its buckets. The zero value,
// FallbackNone, means the buckets decided.
type Fallback uint8

const (
	// FallbackNone: the bucket decided.
	FallbackNone Fallback = iota
	// FallbackBackendFailed: the backend failed this call (an error, or no
	// answer within its timeout).
	FallbackBackendFailed
	// FallbackBreakerOpen: the backend was not asked, having failed the
	// calls before (an open circuit breaker).
	FallbackBreakerOpen
	// FallbackOverloaded: the call's deadline came before the backend could
	// answer, through no fault of the backend's (it waited in this
	// process's queue; see ErrOverloaded).
	FallbackOverloaded
	// FallbackTryAgain: the backend refused the call for now, through no
	// fault of its own, and the deadline came before it would run it (a
	// Redis Cluster slot mid-move; see ErrTryAgain).
	FallbackTryAgain
)

// fallbackNames are the causes' names, as metrics label them.
var fallbackNames = [...]string{
	FallbackNone:          "none",
	FallbackBackendFailed: "backend_failed",
	FallbackBreakerOpen:   "breaker_open",
	FallbackOverloaded:    "overloaded",
	FallbackTryAgain:      "try_again",
}

// String names the cause as metrics label it.
func (f Fallback) String() string {
	if int(f) < len(fallbackNames) {
		return fallbackNames[f]
	}
	return fmt.Sprintf("Fallback(%d)", uint8(f))
}

// Store keeps buckets and applies requests to them.
//
// Take applies reqs at time now atomically and all-or-nothing: either every
// request is admitted and charged, or none is charged, except post-paid
// charges (Request.Charge), which are recorded (with CountWhereDenied, only
// those that were themselves denied). A denied Shadow
// request is not charged and does not deny the others. When one is denied,
// the others report the state their bucket is in (as if checked with Hits 0).
// Requests naming the same key are applied in order, each seeing the ones
// before it. The returned slice has one Decision per request, in order.
//
// A store may take time from elsewhere than now (the Redis store uses the
// Redis server's clock), but it must make the same decisions as Decide for the
// time it uses. Implementations must be safe for concurrent use.
type Store interface {
	Take(ctx context.Context, now time.Time, reqs []Request) ([]Decision, error)
}

// DeadlineTaker is a Store that can be told, beside ctx, when to give up:
// TakeBy(ctx, by, now, reqs) is Take(ctx', now, reqs) where ctx' is ctx
// ending at by (context.WithDeadline), but the store need not make ctx'
// (a timer and a registration with ctx, for every call) where it can
// bound its waits otherwise. At by, a call still waiting for its backend
// returns an error wrapping a *DeadlineError that wraps
// context.DeadlineExceeded, as Take does when its context's deadline
// passes. A zero by is no bound beyond ctx. Implementations must be safe
// for concurrent use.
type DeadlineTaker interface {
	Store
	TakeBy(ctx context.Context, by, now time.Time, reqs []Request) ([]Decision, error)
}

// TakeBy is s.TakeBy when s is a DeadlineTaker, else s.Take under ctx
// ending at by; a zero by is s.Take under ctx.
func TakeBy(s Store, ctx context.Context, by, now time.Time, reqs []Request) ([]Decision, error) {
	if by.IsZero() {
		return s.Take(ctx, now, reqs)
	}
	if dt, ok := s.(DeadlineTaker); ok {
		return dt.TakeBy(ctx, by, now, reqs)
	}
	ctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	return s.Take(ctx, now, reqs)
}

// Refunder is a Store that can give tokens back.
//
// Refund gives back the Hits of each request (a reservation whose caller
// gave up, or Envoy's negative hits): each bucket's TAT moves back by the
// time those tokens take to arrive (Refund, the function), but never before
// now, since a bucket cannot be fuller than full. Implementations must be
// safe for concurrent use.
type Refunder interface {
	Refund(ctx context.Context, now time.Time, reqs []Request) error
}

// ErrInvalidRequest is wrapped by stores when a Request has an invalid Limit
// or Hits out of range.
var ErrInvalidRequest = errors.New("invalid request")

// ErrUnavailable is wrapped by stores when the backend cannot be reached or
// did not answer in time.
var ErrUnavailable = errors.New("backend unavailable")

// ErrTryAgain is wrapped by stores when the backend refused a call for now
// without running it, for a reason that is no fault of the part that
// answered: a Redis Cluster slot in the middle of a move (TRYAGAIN, or
// redirects that did not settle), or a cluster that reports itself down
// while it fails over (CLUSTERDOWN). It must not count against the
// backend's health.
var ErrTryAgain = errors.New("the backend asked for the call again later")

// ErrOverloaded is wrapped by stores when a call's deadline came before the
// backend answered and the backend is not to blame: the call waited in this
// process (for a batch, a connection, a CPU) and the backend had it for less
// than its timeout, or not at all. It says the process is saturated, not
// that the backend failed, and must not count against the backend.
var ErrOverloaded = errors.New("deadline reached before the backend could answer (this process is overloaded)")

// A DeadlineError is returned by a store whose call's context ended (its
// deadline, or its cancellation), or whose DeadlineTaker bound passed,
// before the backend answered. It wraps the context's error
// (context.DeadlineExceeded for a bound). InFlight is how long the backend had had the call by
// then: zero if it was never sent (it waited in a queue of the store's).
// Whether that is the backend's fault is for the caller to judge against
// the time the backend is given (see internal/failover).
type DeadlineError struct {
	// Queued is how long the call waited in the store before it was sent
	// (until it was given up on, if it never was).
	Queued time.Duration
	// InFlight is how long the backend had had the call, zero if unsent.
	InFlight time.Duration
	// Stalled, for a call never sent, is how long the backend had by then
	// held the oldest round trip the call was queued behind, on the same
	// connection's worth of work (on a Redis Cluster, the same node): a
	// call that waits because the backend does not answer what it was
	// sent waits for the backend, not for this process. Zero when nothing
	// was in flight ahead of it.
	Stalled time.Duration
	// Pending reports that the store still awaits the backend's answer to
	// the sent call and reports that outcome itself when it comes (see
	// redisstore.Options.OnBackend).
	Pending bool
	// Err is the context's error.
	Err error
}

func (e *DeadlineError) Error() string {
	if e.InFlight == 0 {
		if e.Stalled > 0 {
			return fmt.Sprintf("%v after %v queued, before the call was sent, behind a round trip the backend had held for %v", e.Err,
				e.Queued.Round(time.Microsecond), e.Stalled.Round(time.Microsecond))
		}
		return fmt.Sprintf("%v after %v queued, before the call was sent", e.Err, e.Queued.Round(time.Microsecond))
	}
	pending := ""
	if e.Pending {
		pending = " (its answer is still awaited)"
	}
	return fmt.Sprintf("%v after %v queued and %v at the backend without an answer%s", e.Err,
		e.Queued.Round(time.Microsecond), e.InFlight.Round(time.Microsecond), pending)
}

func (e *DeadlineError) Unwrap() error { return e.Err }

// Held is how long the backend had held the call, or the work it was
// queued behind, when its caller gave up: the larger of InFlight and
// Stalled. A backend that held it for its whole timeout failed it.
func (e *DeadlineError) Held() time.Duration { return max(e.InFlight, e.Stalled) }

// A ShardError is a backend failure confined to one shard of a sharded
// backend (a Redis Cluster node): the other shards may be working. Shard
// names it as Sharded.Shard does.
type ShardError struct {
	Shard string
	Err   error
}

func (e *ShardError) Error() string { return fmt.Sprintf("shard %s: %v", e.Shard, e.Err) }

func (e *ShardError) Unwrap() error { return e.Err }

// Sharded is a Store whose buckets live on shards that fail apart (the
// nodes of a Redis Cluster). Shard names the shard that holds the bucket
// named key now; "" means the store cannot tell (its topology is not
// known yet). The answer may change as the topology does (a failover, a
// slot move). It must be cheap and safe for concurrent use.
type Sharded interface {
	Shard(key string) string
}

// Validate reports whether r can be given to a Store.
func (r Request) Validate() error {
	if r.Hits < 0 || r.Hits > MaxTokens {
		return fmt.Errorf("%w: hits %d out of range [0, %d]", ErrInvalidRequest, r.Hits, int64(MaxTokens))
	}
	if r.Counting > CountWhereDenied {
		return fmt.Errorf("%w: %v", ErrInvalidRequest, r.Counting)
	}
	if r.MaxWait < 0 || r.MaxWait > MaxFill {
		return fmt.Errorf("%w: max wait %v out of range [0, %v]", ErrInvalidRequest, r.MaxWait, MaxFill)
	}
	if err := r.Limit.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}
