package server

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// logFailure logs a backend failure (or a call whose deadline came before
// the backend could answer it), through logThrottled.
func (s *Server) logFailure(ctx context.Context, now time.Time, domain string, err error) {
	if errors.Is(err, limiter.ErrInvalidRequest) || errors.Is(err, context.Canceled) {
		return
	}
	msg := "backend failed"
	if errors.Is(err, limiter.ErrOverloaded) {
		msg = "deadline reached before the backend could answer"
	}
	s.logThrottled(ctx, now, msg, "domain", domain, "err", err)
}

// logFallback logs a call answered per the store's failure mode (a store
// answers a Take that way as a whole, so its first decision tells), through
// logThrottled.
func (s *Server) logFallback(ctx context.Context, now time.Time, domain string, cause limiter.Fallback) {
	s.logThrottled(ctx, now, "answered per the failure mode", "domain", domain, "cause", cause.String())
}

// logThrottled logs a warning at most once a second (failures and
// fallbacks share the second), with the number of lines not logged since
// the last.
func (s *Server) logThrottled(ctx context.Context, now time.Time, msg string, attrs ...any) {
	last := s.lastFailureLog.Load()
	if now.UnixNano()-last < int64(time.Second) || !s.lastFailureLog.CompareAndSwap(last, now.UnixNano()) {
		s.quietFailures.Add(1)
		return
	}
	s.log.WarnContext(ctx, msg, append(attrs, "unlogged_since_last", s.quietFailures.Swap(0))...)
}
