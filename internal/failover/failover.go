// Package failover wraps a shared limiter.Store (Redis) with what the
// service does when that store fails: a budget for every call (the
// caller's deadline), a circuit breaker that stops hammering a dead
// backend, and the operator's choice of answer while it is down (error,
// allow, deny, or local buckets).
//
// A call's budget is its caller's deadline less a margin for the answer to
// travel back (see budget.go: a tenth of the time left, at most 5ms,
// more on a host where calls come back late), or Options.DefaultDeadline
// when it has none: the backend decides whenever it answers within it.
// Only what the backend failed (an error, or what it held for
// Options.Timeout without an answer) counts against the backend, and on a
// sharded backend against the shard that failed (see shards.go); a call
// whose budget ran out while it waited in this process (a batch queue, a
// busy CPU) is answered per the failure mode as overloaded, and the
// breaker does not hear of it.
package failover

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Mode is what the service answers while the backend is failing. The zero
// value is invalid.
type Mode int

const (
	// Error answers gRPC UNAVAILABLE, so that Envoy's failure_mode_deny
	// decides (Envoy lets the request through by default).
	Error Mode = iota + 1
	// Allow admits every request, as if each bucket were full.
	Allow
	// Deny denies every request, with a Retry-After of when the backend is
	// next tried.
	Deny
	// Local enforces the same limits with in-process buckets at the rate
	// divided by Options.ReplicasHint, after Options.Grace answered per
	// Options.GraceMode.
	Local
)

// modeNames are the modes' names, indexed by Mode.
var modeNames = [...]string{Error: "error", Allow: "allow", Deny: "deny", Local: "local"}

// String returns the mode's name.
func (m Mode) String() string {
	if m >= Error && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults of Options.
const (
	// DefaultOpenFor is Options.OpenFor when it is not set: a backend
	// that answers again is used within about that much of its fault's
	// end (more when the probe in flight as it ended fails: within 0.3s
	// on a busy host), and a breaker a stall of this process opened on a
	// healthy backend costs that much of failure-mode answers.
	DefaultOpenFor = 100 * time.Millisecond
	// DefaultTimeout is Options.Timeout when it is not set.
	DefaultTimeout = 10 * time.Millisecond
	// DefaultDeadline is Options.DefaultDeadline when it is not set.
	DefaultDeadline = time.Second
	// DefaultFailureThreshold is Options.FailureThreshold when it is not set.
	DefaultFailureThreshold = 3
)

// Options configures a Store. Zero fields take the defaults.
type Options struct {
	// Mode is the answer while the backend fails. Default Error.
	Mode Mode
	// Timeout is how long the backend has a call, from when the call is
	// sent to it, before a call still unanswered when its budget runs out
	// is the backend's failure rather than this process's overload (see
	// Store.Take). It does not cut a call short: the budget does. Default
	// DefaultTimeout, 10ms, half of Envoy's default 20ms deadline.
	Timeout time.Duration
	// DefaultDeadline is the budget of a call that comes without a
	// deadline. Default DefaultDeadline, 1s.
	DefaultDeadline time.Duration
	// FailureThreshold consecutive failures open the breaker, once they
	// have gone on for FailingFor. Default 3.
	FailureThreshold int
	// FailingFor is how long failures must go on, as they are reported,
	// with no call succeeding in between, before the breaker opens: one
	// slow batch (a GC pause, a CPU-starved moment) fails many concurrent
	// calls at once, and must not turn into OpenFor of failure-mode
	// answers, while a Redis that is down or stalled keeps failing and
	// opens it after this. A round trip Redis holds is reported Timeout
	// after it was sent, so a black hole or a latency spike opens it
	// Timeout + FailingFor after it began: with the default, two Timeouts
	// (20ms), leaving a Timeout of room under three. Default Timeout;
	// negative means no minimum (FailureThreshold alone).
	FailingFor time.Duration
	// OpenFor is how long the open breaker answers without the backend
	// before one call (or Probe) probes it again. Default
	// DefaultOpenFor, 100ms.
	OpenFor time.Duration
	// ReplicasHint divides every rate, burst and max debt in Local mode, so
	// that N replicas together stay near the configured limit. Default 1.
	ReplicasHint int64
	// Grace is how long, from the first failure, Local mode answers per
	// GraceMode before it starts limiting locally. Default 0.
	Grace time.Duration
	// GraceMode answers during Grace: Error, Allow or Deny. Default Error.
	GraceMode Mode
	// Now is the clock for the breaker and grace; default time.Now.
	Now func() time.Time
	// TimerLateness, when set, returns how late this process's timers
	// fire lately, at the given time (timerlag.Monitor.Lateness): the
	// budget keeps twice that as its margin, as for the lateness of the
	// calls whose budget ran out (see budget.go), so that a call
	// answered at its budget's end reaches its caller in time on a host
	// that wakes this process late, before any call has come back late.
	TimerLateness func(time.Time) time.Duration
	// Probe, when set, asks the backend whether it can decide calls (for
	// Redis, redisstore.Store.Probe, a write rather than a PING, so that a
	// read-only replica fails it), and is used by Probe; it gets a context
	// with the budget of a call (see DefaultDeadline), cut to
	// probeTimeouts × Timeout (see Store.Probe), and must be safe for
	// concurrent use. Its errors are judged as a call's. Nil: Probe does
	// nothing, and only a call closes the open breaker.
	Probe func(context.Context) error
	// ProbeInBackground says that Probe is called often (every few
	// milliseconds; the daemon calls it every quarter of OpenFor, at most
	// 25ms apart), and makes it the open breaker's only probe: a call is
	// never the probe, and is answered per the failure mode until a Probe
	// succeeds. A call that probes waits for its whole budget when the
	// backend still does not answer, and its answer then reaches its
	// caller at the deadline's edge; a check costs no caller anything.
	// It needs Probe (and, with Shard, ProbeShard).
	ProbeInBackground bool
	// OnBackendFailure, when set, is called with the error of every call
	// or probe the backend failed, whatever the mode and whether or not the
	// breaker opens; OnFallback with the cause of every call answered per
	// the failure mode (also in Error mode, where the answer is an error).
	// Both are called on the call's goroutine and must be quick and safe
	// for concurrent use.
	OnBackendFailure func(err error)
	OnFallback       func(cause limiter.Fallback)
	// OnChange, when set, is called with false (and the last error) when
	// the breaker opens, the backend being found failing, and with true when
	// a call or a Probe succeeds again after that. Failures that do not open
	// the breaker (one slow batch) are not reported. It is called on the
	// goroutine of the request (or Probe) that made the change, without the
	// Store's locks held, one call at a time and in order: a change made
	// while a call is in progress is reported when it returns, unless undone
	// by then, so the calls alternate and the last one reports the current
	// state. It may call the Store.
	OnChange func(healthy bool, err error)

	// Shard, when set, names the shard of the backend that holds the
	// bucket named key (limiter.Sharded.Shard): each shard then has a
	// breaker of its own, a Take asks those of its buckets' shards, and a
	// failure counts against the shard it names (a *limiter.ShardError),
	// or every shard of the Take when it names none. The backend is then
	// Healthy while some shard's breaker is closed. Nil: one breaker for
	// the whole backend.
	Shard func(key string) string
	// ProbeShard, when set, is Probe for one named shard's open breaker
	// (Probe itself is for the whole backend's, and for buckets whose
	// shard was not known).
	ProbeShard func(ctx context.Context, shard string) error
	// PoolShard is Shard for a lease pool (limiter.LeaseStore), whose key
	// is not a bucket's. Nil with Shard set: lease pools count in the
	// whole backend's breaker.
	PoolShard func(pool string) string
	// OnShardChange, when set, is OnChange for one named shard: false when
	// its breaker opens, true when a call or probe succeeds after that.
	// OnShardDropped is called when a named shard's breaker is dropped,
	// no call having asked for it for a while (its node left the
	// topology). Both are called as OnChange is.
	OnShardChange  func(shard string, healthy bool, err error)
	OnShardDropped func(shard string)
}

// Store is a limiter.Store over a shared backend with failure handling.
// It is safe for concurrent use.
type Store struct {
	backend  limiter.Store
	local    *limiter.MemoryStore
	opts     Options
	breakers *breakers

	// mu guards when (on Options.Now) the last call was answered by the
	// backend, and from the local buckets: for Refund.
	mu                     sync.Mutex
	lastBackend, lastLocal time.Time

	fallbacks atomic.Int64
	// lateness is how late past their budget's end the calls whose budget
	// ran out lately came back from the backend, in ns: the last one's when
	// it is later than the estimate, else the estimate moved a sixteenth
	// of the way down to it.
	lateness atomic.Int64
	// lateAt is when lateness was last noted (Unix ns): the estimate
	// halves for every latenessHalfLife since, so that one late call
	// does not widen every margin for good.
	lateAt atomic.Int64
}

var _ limiter.Store = (*Store)(nil)

// New wraps backend.
func New(backend limiter.Store, opts Options) (*Store, error) {
	if opts.Mode == 0 {
		opts.Mode = Error
	}
	if opts.GraceMode == 0 {
		opts.GraceMode = Error
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.DefaultDeadline <= 0 {
		opts.DefaultDeadline = DefaultDeadline
	}
	if opts.FailureThreshold <= 0 {
		opts.FailureThreshold = DefaultFailureThreshold
	}
	switch {
	case opts.FailingFor == 0:
		opts.FailingFor = opts.Timeout
	case opts.FailingFor < 0:
		opts.FailingFor = 0
	}
	if opts.OpenFor <= 0 {
		opts.OpenFor = DefaultOpenFor
	}
	if opts.ReplicasHint <= 0 {
		opts.ReplicasHint = 1
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Mode < Error || opts.Mode > Local {
		return nil, fmt.Errorf("failover: invalid mode %v", opts.Mode)
	}
	if opts.GraceMode < Error || opts.GraceMode > Deny {
		return nil, fmt.Errorf("failover: grace mode %v: want error, allow or deny", opts.GraceMode)
	}
	if opts.ProbeInBackground && (opts.Probe == nil || opts.Shard != nil && opts.ProbeShard == nil) {
		return nil, errors.New("failover: ProbeInBackground needs Probe (and, with Shard, ProbeShard)")
	}
	s := &Store{backend: backend, opts: opts, breakers: newBreakers(opts)}
	if opts.Mode == Local {
		s.local = limiter.NewMemoryStore(limiter.MemoryOptions{})
	}
	return s, nil
}

// Take implements limiter.Store: it asks the backend unless the breaker is
// open, and answers per the failure mode when the backend fails or the
// call's budget runs out first.
//
// The backend gets the call's budget (see the package doc). When the
// backend returns an error, that is a backend failure. When the budget runs
// out first (the backend returns a *limiter.DeadlineError), the call is
// judged by how long the backend had it:
//   - at least Options.Timeout: the backend did not answer in the time it
//     is given, a failure;
//   - less, or not at all (the call waited in this process), or the store
//     still awaits the answer and reports it itself (Pending; see Observe):
//     the call tells nothing of the backend, and the process is taken to be
//     overloaded. The breaker does not hear of it (a half-open probe is
//     released untried) and the error wraps limiter.ErrOverloaded.
//
// Either way, when the caller is still waiting (the margin before its
// deadline), the call is answered per the failure mode, with the cause in
// every Decision's Fallback (limiter.FallbackBackendFailed or
// FallbackOverloaded; FallbackBreakerOpen when the backend was not asked),
// so that it reaches the caller before the caller gives up. When the
// caller has gone (it cancelled), the error is returned and nothing is
// charged to the local buckets.
func (s *Store) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	adm, ok, o := s.breakers.admit(s.shards(reqs))
	if !ok {
		return s.fallback(ctx, now, reqs, o, limiter.FallbackBreakerOpen)
	}
	d, err := s.takeBudgeted(ctx, now, reqs)
	if err == nil {
		s.succeeded(adm, true)
		return d, nil
	}
	if errors.Is(err, limiter.ErrInvalidRequest) {
		adm.release()
		return nil, err
	}
	cause, o, err := s.settle(adm, err)
	if ctx.Err() != nil {
		return nil, gaveUp(ctx, err)
	}
	return s.fallback(ctx, now, reqs, o, cause)
}

// settle judges err, the failure of a backend call that went past adm,
// records it on adm's breakers, and returns why the call is answered per
// the failure mode, the outage that answer reports, and err as judged.
// With shards, each *limiter.ShardError in err is judged on its own (a
// call across nodes can be overloaded on one, refused for now on
// another, and failed by a third): a shard whose part is the backend's
// failure counts it, the other shards of the call are released, and the
// cause is the worst part's (a failure, then a refusal for now, then
// overload). An error naming no shard is judged whole, against every
// shard of the call.
func (s *Store) settle(adm admission, err error) (limiter.Fallback, outage, error) {
	var parts []*limiter.ShardError
	if s.opts.Shard != nil {
		parts = shardErrors(err)
	}
	if len(parts) == 0 {
		switch err = s.judge(err); {
		case errors.Is(err, limiter.ErrOverloaded):
			adm.release()
			return limiter.FallbackOverloaded, outage{err: err}, err
		case errors.Is(err, limiter.ErrTryAgain):
			adm.release()
			return limiter.FallbackTryAgain, outage{err: err}, err
		}
		return limiter.FallbackBackendFailed, adm.failedAll(err), err
	}
	cause, o := limiter.FallbackOverloaded, outage{}
	var failed []string
	for _, p := range parts {
		switch judged := s.judge(p); {
		case errors.Is(judged, limiter.ErrOverloaded):
			if o.err == nil {
				o.err = judged
			}
		case errors.Is(judged, limiter.ErrTryAgain):
			if cause == limiter.FallbackOverloaded {
				cause, o = limiter.FallbackTryAgain, outage{err: judged}
			}
		default:
			so := adm.failedOne(p.Shard, judged)
			if cause != limiter.FallbackBackendFailed {
				cause, o = limiter.FallbackBackendFailed, so
			}
			failed = append(failed, p.Shard)
		}
	}
	adm.releaseExcept(failed)
	if cause == limiter.FallbackOverloaded {
		err = fmt.Errorf("%w: %w", limiter.ErrOverloaded, err)
	}
	return cause, o, err
}

// Observe records what the backend did with a call no caller waited for
// any more, or is still doing with one (see redisstore.Options.OnBackend),
// against shard (or the shard err names; wholeBackend "" for a backend
// that is not sharded). held is how long the backend had held the call:
//   - err nil and held under Options.Timeout: the backend answered in
//     time, which closes the shard's breaker as a call's success does;
//   - err nil and held at least Timeout: it answered, but too late for
//     the calls it serves, a failure;
//   - an error: a failure, judged and counted as a call's; a
//     *limiter.DeadlineError says the call is still unanswered after its
//     Held, a failure once that reaches Timeout, whatever the deadline of
//     the callers who wait for it.
//
// It is safe for concurrent use.
func (s *Store) Observe(shard string, held time.Duration, err error) {
	switch {
	case err == nil && held < s.opts.Timeout:
		if s.opts.Shard == nil {
			shard = wholeBackend
		}
		s.breakers.get(shard).succeeded(false)
		return
	case err == nil:
		err = fmt.Errorf("%w: answered after %v, past the backend timeout %v", limiter.ErrUnavailable, held.Round(time.Microsecond), s.opts.Timeout)
	case errors.Is(err, limiter.ErrInvalidRequest):
		return
	}
	if s.opts.Shard == nil {
		shard = wholeBackend
	} else {
		shard = shardOf(shard, err)
	}
	if err = s.judge(err); !errors.Is(err, limiter.ErrOverloaded) && !errors.Is(err, limiter.ErrTryAgain) {
		s.breakers.get(shard).failedSent(s.opts.Now().Add(-held), err)
	}
}

// shards returns the names of the shards reqs' buckets live on, without
// repeats, or nil when the backend is not sharded.
func (s *Store) shards(reqs []limiter.Request) []string {
	if s.opts.Shard == nil {
		return nil
	}
	names := make([]string, 0, 2)
	for _, r := range reqs {
		if n := s.opts.Shard(r.Key); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// judge returns err, a backend call's, wrapped in limiter.ErrOverloaded if
// it is no failure of the backend's: its budget ran out before the backend
// had held it, or the round trip it was queued behind, for Options.Timeout
// (limiter.DeadlineError.Held). Anything else is a backend failure, and is
// reported to Options.OnBackendFailure.
func (s *Store) judge(err error) error {
	var de *limiter.DeadlineError
	if errors.As(err, &de) && de.Held() < s.opts.Timeout {
		return fmt.Errorf("%w: %w", limiter.ErrOverloaded, err)
	}
	if errors.Is(err, limiter.ErrTryAgain) {
		return err // no failure: not reported
	}
	if s.opts.OnBackendFailure != nil {
		s.opts.OnBackendFailure(err)
	}
	return err
}

// Probe gives the open breaker the probe a call would give it, without a
// call: when the breaker is open, its OpenFor has passed and no probe (a
// call's or another Probe's) is in flight, it calls Options.Probe with the
// budget of a call, at most probeTimeouts × Timeout, as that one probe. A success closes the breaker and
// reports OnChange(true); a failure keeps it open for another OpenFor, as a
// failed probing call does. Otherwise (breaker closed, still within OpenFor,
// a probe in flight, no Options.Probe) it does nothing and returns nil.
//
// It is for a replica that gets no calls while its backend is failing
// (health checks took it out of rotation because it said so): without it
// nothing would close the breaker, and health would never come back. Call
// it about every OpenFor; it is cheap when there is nothing to do. A check
// whose budget runs out through no fault of the backend's (see Take) leaves
// the breaker as it was.
//
// It returns the check's error, wrapped, when it checked and the check failed.
//
// With shards (Options.Shard), it does so for each shard's open breaker,
// through Options.ProbeShard, and drops the breakers of shards no call
// has asked for in a while; it returns the failed checks' errors joined.
func (s *Store) Probe(ctx context.Context) error {
	s.breakers.sweep()
	due := s.breakers.due()
	errs := make([]error, len(due))
	var wg sync.WaitGroup
	for i, sb := range due {
		check := s.opts.Probe
		if sb.name != wholeBackend {
			check = nil
			if s.opts.ProbeShard != nil {
				name := sb.name
				check = func(ctx context.Context) error { return s.opts.ProbeShard(ctx, name) }
			}
		}
		if check == nil {
			continue
		}
		// At once: one shard that does not answer holds its own probe
		// to the budget, not the others'.
		wg.Go(func() { errs[i] = s.probe(ctx, sb.breaker, check) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// probeTimeouts is how many Options.Timeout a Probe's check is given at
// most: a backend that holds it for Timeout has failed it already (see
// judge), and the breaker admits no other probe while it is in flight. A
// check given a call's whole budget (DefaultDeadline, a second, for the
// daemon's Probe, which has no deadline) held the breaker open that long
// when a node in a black hole came back: measured, 0.7-1 s from the end
// of a 3 s black hole to Redis deciding again. Three Timeouts leave room
// for the slot map's round trip before the probe's own (see
// redisstore.Store.ProbeNode) and for a wait for a CPU.
const probeTimeouts = 3

// probe gives b the probe a call would give it, with check (see Probe).
func (s *Store) probe(ctx context.Context, b *breaker, check func(context.Context) error) error {
	probe, _, _ := b.admit(false)
	if !probe {
		return nil // closed, within OpenFor, or a probe in flight
	}
	end := s.budgetEnd(ctx)
	if cut := time.Now().Add(probeTimeouts * s.opts.Timeout); cut.Before(end) {
		end = cut
	}
	callCtx, cancel := context.WithDeadline(ctx, end)
	err := check(callCtx)
	cancel()
	if err == nil {
		b.succeeded(true) // a check is no call: not for Refund
		return nil
	}
	if err = s.judge(err); errors.Is(err, limiter.ErrOverloaded) || errors.Is(err, limiter.ErrTryAgain) {
		b.release(true)
		return fmt.Errorf("probe: %w", err)
	}
	b.failed(true, err)
	return fmt.Errorf("probe: %w", err)
}

// succeeded records a backend success on the shards of a, closing their
// breakers; answered says it was a call the backend answered (not a
// Probe's check), for Refund.
func (s *Store) succeeded(a admission, answered bool) {
	// lastBackend matters only beside local buckets (see Refund): other
	// modes skip the clock read on every call.
	if answered && s.local != nil {
		now := s.opts.Now()
		s.mu.Lock()
		s.lastBackend = latest(s.lastBackend, now)
		s.mu.Unlock()
	}
	a.succeeded()
}

// Healthy reports whether the backend is taken to be working: false from
// when the breaker opens until a call or a Probe succeeds again (failures
// that do not open the breaker leave it true). It is what OnChange last
// reported, or is about to.
//
// With shards (Options.Shard), it is false only while every shard's
// breaker that calls still ask for has opened: a replica that can decide
// the buckets of some shards stays in rotation, since every replica sees
// the same failed shard, and one taken out could decide none.
func (s *Store) Healthy() bool { return s.breakers.healthy() }

// Mode returns the failure mode.
func (s *Store) Mode() Mode { return s.opts.Mode }

// Fallbacks returns how many calls were answered by the failure mode.
func (s *Store) Fallbacks() int64 { return s.fallbacks.Load() }

// Sweep drops idle local buckets (Local mode).
func (s *Store) Sweep(now time.Time) {
	if s.local != nil {
		s.local.Sweep(now)
	}
}
