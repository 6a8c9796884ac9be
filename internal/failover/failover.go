// Package failover wraps a shared limiter.Store (Redis) with what the
// service does when that store fails: a deadline on every call, a circuit
// breaker that stops hammering a dead backend, and the operator's choice of
// answer while it is down (error, allow, deny, or local buckets).
package failover

import (
	"context"
	"errors"
	"fmt"
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

// String returns the mode's name.
func (m Mode) String() string {
	switch m {
	case Error:
		return "error"
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	case Local:
		return "local"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options configures a Store. Zero fields take the defaults.
type Options struct {
	// Mode is the answer while the backend fails. Default Error.
	Mode Mode
	// Timeout bounds every backend call. Default 10ms: half of Envoy's
	// default 20ms for the whole rate-limit call.
	Timeout time.Duration
	// FailureThreshold consecutive failures open the breaker, once they
	// have gone on for FailingFor. Default 3.
	FailureThreshold int
	// FailingFor is how long failures must go on, with no call succeeding
	// in between, before the breaker opens: one slow batch (a GC pause, a
	// CPU-starved moment) fails many concurrent calls at once, and must not
	// turn into OpenFor of failure-mode answers, while a Redis that is down
	// or stalled keeps failing and opens it after this. Default twice
	// Timeout; negative means no minimum (FailureThreshold alone).
	FailingFor time.Duration
	// OpenFor is how long the open breaker answers without the backend
	// before one call probes it again. Default 500ms.
	OpenFor time.Duration
	// ReplicasHint divides every rate and burst in Local mode, so that N
	// replicas together stay near the configured limit. Default 1.
	ReplicasHint int64
	// Grace is how long, from the first failure, Local mode answers per
	// GraceMode before it starts limiting locally. Default 0.
	Grace time.Duration
	// GraceMode answers during Grace: Error, Allow or Deny. Default Error.
	GraceMode Mode
	// Now is the clock for the breaker and grace; default time.Now.
	Now func() time.Time
	// OnChange, when set, is called (on a request's goroutine, without
	// locks held) each time the backend is found failing or working again.
	OnChange func(healthy bool, err error)
}

// Store is a limiter.Store over a shared backend with failure handling.
// It is safe for concurrent use.
type Store struct {
	backend limiter.Store
	local   *limiter.MemoryStore
	opts    Options

	mu          sync.Mutex
	failures    int       // consecutive
	openUntil   time.Time // zero when closed
	probing     bool      // a half-open probe is in flight
	outageStart time.Time // when the first of the failures failed; zero while healthy
	lastErr     error

	fallbacks atomic.Int64
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
		opts.Timeout = 10 * time.Millisecond
	}
	if opts.FailureThreshold <= 0 {
		opts.FailureThreshold = 3
	}
	switch {
	case opts.FailingFor == 0:
		opts.FailingFor = 2 * opts.Timeout
	case opts.FailingFor < 0:
		opts.FailingFor = 0
	}
	if opts.OpenFor <= 0 {
		opts.OpenFor = 500 * time.Millisecond
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
	s := &Store{backend: backend, opts: opts}
	if opts.Mode == Local {
		s.local = limiter.NewMemoryStore(limiter.MemoryOptions{})
	}
	return s, nil
}

// Take implements limiter.Store: it asks the backend unless the breaker is
// open, and answers per the failure mode when the backend fails.
func (s *Store) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	probe, ok := s.admit()
	if ok {
		callCtx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		d, err := s.backend.Take(callCtx, now, reqs)
		cancel()
		switch {
		case err == nil:
			s.succeeded(probe)
			return d, nil
		case errors.Is(err, limiter.ErrInvalidRequest):
			s.release(probe)
			return nil, err
		case ctx.Err() != nil:
			// The caller gave up (Envoy's own timeout): not the backend's fault.
			s.release(probe)
			return nil, ctx.Err()
		}
		s.failed(probe, err)
	}
	return s.fallback(ctx, now, reqs)
}

// admit reports whether to call the backend now, and whether that call is
// the one probe of a half-open breaker.
func (s *Store) admit() (probe, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.openUntil.IsZero() {
		return false, true
	}
	if s.probing || s.opts.Now().Before(s.openUntil) {
		return false, false
	}
	s.probing = true
	return true, true
}

func (s *Store) release(probe bool) {
	if probe {
		s.mu.Lock()
		s.probing = false
		s.mu.Unlock()
	}
}

func (s *Store) succeeded(probe bool) {
	s.mu.Lock()
	recovered := !s.outageStart.IsZero()
	s.failures, s.openUntil, s.outageStart, s.lastErr = 0, time.Time{}, time.Time{}, nil
	if probe {
		s.probing = false
	}
	s.mu.Unlock()
	if recovered && s.opts.OnChange != nil {
		s.opts.OnChange(true, nil)
	}
}

// failed records a backend failure: the outage starts at the first, and
// the breaker opens on a failed probe, or once FailureThreshold
// consecutive failures have gone on for FailingFor since it started.
func (s *Store) failed(probe bool, err error) {
	now := s.opts.Now()
	s.mu.Lock()
	first := s.outageStart.IsZero()
	if first {
		s.outageStart = now
	}
	s.failures++
	s.lastErr = err
	if probe || (s.failures >= s.opts.FailureThreshold && now.Sub(s.outageStart) >= s.opts.FailingFor) {
		s.openUntil = now.Add(s.opts.OpenFor)
	}
	if probe {
		s.probing = false
	}
	s.mu.Unlock()
	if first && s.opts.OnChange != nil {
		s.opts.OnChange(false, err)
	}
}

// fallback answers reqs per the failure mode.
func (s *Store) fallback(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	s.fallbacks.Add(1)
	s.mu.Lock()
	lastErr, outageStart, openUntil := s.lastErr, s.outageStart, s.openUntil
	s.mu.Unlock()
	mode := s.opts.Mode
	if mode == Local && s.opts.Now().Sub(outageStart) < s.opts.Grace {
		mode = s.opts.GraceMode
	}
	switch mode {
	case Allow:
		d := make([]limiter.Decision, len(reqs))
		for i, r := range reqs {
			d[i] = limiter.Decision{Allowed: true, Remaining: max(0, r.Limit.Burst-r.Hits)}
		}
		return d, nil
	case Deny:
		retry := max(time.Second, openUntil.Sub(s.opts.Now()))
		d := make([]limiter.Decision, len(reqs))
		for i := range reqs {
			d[i] = limiter.Decision{RetryAfter: retry}
		}
		return d, nil
	case Local:
		local := make([]limiter.Request, len(reqs))
		for i, r := range reqs {
			r.Limit = s.share(r.Limit)
			local[i] = r
		}
		return s.local.Take(ctx, now, local)
	}
	if lastErr == nil {
		lastErr = errors.New("circuit open")
	}
	return nil, fmt.Errorf("%w (failure mode error): %w", limiter.ErrUnavailable, lastErr)
}

// share is this replica's part of l in Local mode: rate and burst divided
// by ReplicasHint, at least one token.
func (s *Store) share(l limiter.Limit) limiter.Limit {
	n := s.opts.ReplicasHint
	return limiter.Limit{Count: max(1, l.Count/n), Period: l.Period, Burst: max(1, l.Burst/n)}
}

// Healthy reports whether the backend answered the last call made to it.
func (s *Store) Healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.outageStart.IsZero()
}

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

// Refund implements limiter.Refunder when the backend does: it gives the
// tokens back there (within the deadline), or to the local buckets while
// the backend fails in Local mode. Otherwise a refund during an outage is
// lost, which can only make later answers stricter.
func (s *Store) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	refunder, ok := s.backend.(limiter.Refunder)
	if !ok {
		return fmt.Errorf("%w: the backend cannot give tokens back", limiter.ErrInvalidRequest)
	}
	s.mu.Lock()
	open := !s.openUntil.IsZero()
	s.mu.Unlock()
	if open {
		if s.local != nil {
			local := make([]limiter.Request, len(reqs))
			for i, r := range reqs {
				r.Limit = s.share(r.Limit)
				local[i] = r
			}
			return s.local.Refund(ctx, now, local)
		}
		return nil
	}
	callCtx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	return refunder.Refund(callCtx, now, reqs)
}
