package failover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Leases is a limiter.LeaseStore over a shared one (Redis's lease pools)
// that fails as s does: every call gets s's budget, counts in s's circuit
// breaker, and, when the backend fails or the breaker is open, is
// answered per s's failure mode, as a Take is:
//
//   - Error: the error (ErrUnavailable), which Envoy's failure_mode_deny
//     decides;
//   - Allow: the lease is admitted, and a release succeeds (nothing is
//     held);
//   - Deny: the lease is denied, with the Retry-After of a denied Take;
//   - Local: this replica's own pools (limiter.MemoryLeases), each
//     admitting MaxInFlight / Options.ReplicasHint (at least one), as
//     Local divides buckets.
//
// A release is also given to the local pools in Local mode, whatever the
// backend answers, so that a lease taken there while the backend was down
// is freed when its stream ends after the backend is back. Leases are
// not moved between the two: one taken locally is unknown to the backend
// (its slot there was never taken), and the other way round.
type Leases struct {
	s       *Store
	backend limiter.LeaseStore
	local   *limiter.MemoryLeases // Local mode only
}

// Leases returns backend's lease pools failing as s does. backend is the
// same shared store s wraps for buckets.
func (s *Store) Leases(backend limiter.LeaseStore) *Leases {
	l := &Leases{s: s, backend: backend}
	if s.opts.Mode == Local {
		l.local = limiter.NewMemoryLeases(limiter.MemoryOptions{})
	}
	return l
}

// Acquire implements limiter.LeaseStore.
func (l *Leases) Acquire(ctx context.Context, now time.Time, r limiter.LeaseRequest) (limiter.LeaseDecision, error) {
	if err := r.Limit.Validate(); err != nil {
		return limiter.LeaseDecision{}, err
	}
	var d limiter.LeaseDecision
	o, cause, err := l.call(ctx, r.Pool, func(ctx context.Context) (err error) {
		d, err = l.backend.Acquire(ctx, now, r)
		return err
	})
	if err != nil || cause == limiter.FallbackNone {
		return d, err
	}
	switch l.s.mode(o) {
	case Allow:
		return limiter.LeaseDecision{Allowed: true, InFlight: 1, Remaining: max(0, r.Limit.MaxInFlight-1)}, nil
	case Deny:
		return limiter.LeaseDecision{RetryAfter: max(time.Second, o.openUntil.Sub(l.s.opts.Now()))}, nil
	case Local:
		r.Limit.MaxInFlight = max(1, r.Limit.MaxInFlight/l.s.opts.ReplicasHint)
		d, err := l.local.Acquire(ctx, now, r)
		if err != nil {
			return d, fmt.Errorf("local lease pools: %w", err)
		}
		return d, nil
	}
	return limiter.LeaseDecision{}, errorOf(o)
}

// Release implements limiter.LeaseStore.
func (l *Leases) Release(ctx context.Context, now time.Time, pool, id string) (limiter.LeaseRelease, error) {
	var local limiter.LeaseRelease
	if l.local != nil {
		local, _ = l.local.Release(ctx, now, pool, id)
	}
	var d limiter.LeaseRelease
	o, cause, err := l.call(ctx, pool, func(ctx context.Context) (err error) {
		d, err = l.backend.Release(ctx, now, pool, id)
		return err
	})
	if err != nil || cause == limiter.FallbackNone {
		if local.Released && !d.Released {
			return local, err
		}
		return d, err
	}
	switch l.s.mode(o) {
	case Allow, Deny:
		return limiter.LeaseRelease{}, nil
	case Local:
		return local, nil
	}
	return limiter.LeaseRelease{}, errorOf(o)
}

// InFlight implements limiter.LeaseStore: the backend's view, or, while it
// fails, the local pools' in Local mode.
func (l *Leases) InFlight(ctx context.Context, now time.Time, pool string) (limiter.PoolState, error) {
	var st limiter.PoolState
	o, cause, err := l.call(ctx, pool, func(ctx context.Context) (err error) {
		st, err = l.backend.InFlight(ctx, now, pool)
		return err
	})
	if err != nil || cause == limiter.FallbackNone {
		return st, err
	}
	if l.local != nil && l.s.mode(o) == Local {
		return l.local.InFlight(ctx, now, pool)
	}
	return limiter.PoolState{}, errorOf(o)
}

// call runs one backend call as Take does: past the breaker, within the
// budget, judged. It returns the outage and why the failure mode must
// answer (FallbackNone: the backend answered, or err is to be returned as
// it is).
func (l *Leases) call(ctx context.Context, pool string, f func(context.Context) error) (outage, limiter.Fallback, error) {
	s := l.s
	// A pool is one key: its shard's breaker, as a bucket's.
	var shards []string
	if s.opts.PoolShard != nil {
		shards = []string{s.opts.PoolShard(pool)}
	}
	adm, ok, o := s.breakers.admit(shards)
	if !ok {
		s.noteFallback(limiter.FallbackBreakerOpen)
		return o, limiter.FallbackBreakerOpen, nil
	}
	callCtx, cancel := s.budget(ctx)
	err := f(callCtx)
	cancel()
	if err == nil {
		s.succeeded(adm, true)
		return outage{}, limiter.FallbackNone, nil
	}
	if errors.Is(err, limiter.ErrInvalidRequest) {
		adm.release()
		return outage{}, limiter.FallbackNone, err
	}
	cause, o, err := s.settle(adm, err)
	if ctx.Err() != nil {
		return o, limiter.FallbackNone, gaveUp(ctx, err)
	}
	s.noteFallback(cause)
	return o, cause, nil
}

// noteFallback counts a failure-mode answer and reports it.
func (s *Store) noteFallback(cause limiter.Fallback) {
	s.fallbacks.Add(1)
	if s.opts.OnFallback != nil {
		s.opts.OnFallback(cause)
	}
}

// mode is the failure mode that answers now, given the outage: GraceMode
// during Options.Grace of a Local outage (o.start is the first failure as
// the call saw it, under the lock that decided the call: a success since
// then does not restart the grace).
func (s *Store) mode(o outage) Mode {
	if s.opts.Mode == Local && s.opts.Now().Sub(o.start) < s.opts.Grace {
		return s.opts.GraceMode
	}
	return s.opts.Mode
}

// errorOf is the error failure mode error answers with.
//
// A context's error inside the outage's (go-redis can fail a dial shared
// with a caller that left with "context canceled") is not this caller's:
// it is kept as text, so that the answer is never read as the caller's
// own cancellation (gRPC CANCELED) while the caller still waits.
func errorOf(o outage) error {
	err := o.err
	if err == nil {
		err = errors.New("circuit open")
	}
	ctxErr := errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
	switch {
	case errors.Is(err, limiter.ErrOverloaded) && ctxErr:
		return fmt.Errorf("failure mode error: %w: %v", limiter.ErrOverloaded, err)
	case errors.Is(err, limiter.ErrOverloaded):
		return fmt.Errorf("failure mode error: %w", err)
	case ctxErr:
		return fmt.Errorf("%w (failure mode error): %v", limiter.ErrUnavailable, err)
	}
	return fmt.Errorf("%w (failure mode error): %w", limiter.ErrUnavailable, err)
}
