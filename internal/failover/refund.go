package failover

import (
	"context"
	"fmt"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// refundSlack is added to a held reservation's MaxWait in Refund's rule:
// it covers the time between the answer that took the tokens and the start
// of the hold, and a hold that ends a little after its wait.
const refundSlack = time.Second

// Refund implements limiter.Refunder when the backend does. It gives the
// tokens back only to a store that certainly took them, and otherwise drops
// the refund, which can only make later answers stricter:
//
//   - A held reservation's refund (some request with MaxWait > 0) took its
//     tokens at most the largest MaxWait (plus refundSlack) before now; a
//     refund without MaxWait (Envoy's negative hits) carries no such bound,
//     and is taken to concern tokens taken within the longest time its
//     buckets take to fill and pay off their debt (Limit.TimeFor(Burst +
//     MaxDebt), plus refundSlack). That span is the refund's window W.
//   - It goes to the backend (within the budget of a call) if the breaker is
//     closed and no call was answered from the local buckets within W
//     before now: else the backend may not have taken those tokens, and
//     would gain tokens it never lost. (The other failure modes take no
//     tokens anywhere: a reservation they answer does not exist, and
//     negative hits that correct a charge the backend failed to take are
//     Envoy's own to send or not.)
//   - It goes to the local buckets (Local mode, divided as they are) if a
//     call was answered from them within W and none by the backend.
//   - Otherwise it is dropped.
//
// Times are on Options.Now; a clock that stepped back counts as within W.
func (s *Store) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	refunder, ok := s.backend.(limiter.Refunder)
	if !ok {
		return fmt.Errorf("%w: the backend cannot give tokens back", limiter.ErrInvalidRequest)
	}
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("refund %d: %w", i, err)
		}
	}
	w := refundWindow(reqs)
	t := s.opts.Now()
	closed := s.breakers.allClosed(s.shards(reqs))
	s.mu.Lock()
	within := func(at time.Time) bool { return !at.IsZero() && t.Sub(at) < w }
	toBackend := closed && !within(s.lastLocal)
	toLocal := s.local != nil && within(s.lastLocal) && !within(s.lastBackend)
	s.mu.Unlock()
	switch {
	case toBackend:
		callCtx, cancel := s.budget(ctx)
		defer cancel()
		if err := refunder.Refund(callCtx, now, reqs); err != nil {
			return fmt.Errorf("refund: %w", err)
		}
	case toLocal:
		if err := s.local.Refund(ctx, now, s.shares(reqs)); err != nil {
			return fmt.Errorf("refund to the local buckets: %w", err)
		}
	}
	return nil
}

// refundWindow is how long before a refund of reqs the tokens were taken,
// at most (see Refund).
func refundWindow(reqs []limiter.Request) time.Duration {
	var wait, fill time.Duration
	for _, r := range reqs {
		wait = max(wait, r.MaxWait)
		fill = max(fill, r.Limit.TimeFor(r.Limit.Burst+r.Limit.MaxDebt))
	}
	if wait > 0 {
		return wait + refundSlack
	}
	return fill + refundSlack
}
