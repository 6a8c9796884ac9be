package failover

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Margins kept between a call's budget and its caller's deadline, for the
// failure mode's answer to reach the caller: a tenth of the time left
// (2ms of Envoy's 20ms: with 1ms, answers sent in time reached an idle
// client 0.1-2ms late, one in a hundred), at most maxMargin; or, on a host where calls
// come back from the backend later than their budget's end (a busy CPU
// wakes the timers late), twice that lateness as lately seen (see
// Store.lateness), up to a quarter of the time left (5ms of 20ms).
const (
	marginDivisor    = 10
	maxMargin        = 5 * time.Millisecond
	maxMarginDivisor = 4
)

// budget returns the context a backend call runs under (but a Take of a
// limiter.DeadlineTaker, see takeBudgeted): ctx, ending a margin (above)
// before its deadline, or DefaultDeadline from now if it has none.
func (s *Store) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, s.budgetEnd(ctx))
}

// budgetEnd is when the budget of a backend call under ctx ends (see
// budget).
func (s *Store) budgetEnd(ctx context.Context) time.Time {
	dl, ok := ctx.Deadline()
	if !ok {
		return time.Now().Add(s.opts.DefaultDeadline)
	}
	now := time.Now()
	left := max(dl.Sub(now), 0)
	margin := min(maxMargin, left/marginDivisor)
	if late := 2 * s.lateNow(now); late > margin {
		margin = min(late, left/maxMarginDivisor)
	}
	return dl.Add(-margin)
}

// latenessHalfLife is how fast the lateness estimate decays while no
// call comes back late.
const latenessHalfLife = time.Second

// lateNow is the lateness estimate at now: as last noted, halved for
// every latenessHalfLife since.
func (s *Store) lateNow(now time.Time) time.Duration {
	late := time.Duration(s.lateness.Load())
	if late == 0 {
		return 0
	}
	halvings := now.Sub(time.Unix(0, s.lateAt.Load())) / latenessHalfLife
	return late >> min(max(halvings, 0), 62)
}

// takeBudgeted asks the backend for reqs within the call's budget (see
// budget): through TakeBy when the backend is a limiter.DeadlineTaker,
// given the budget's end and the caller's context (the backend bounds its
// waits as it can), else under a context that ends then. A call whose
// budget ran out updates the lateness the margins allow for.
func (s *Store) takeBudgeted(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	end := s.budgetEnd(ctx)
	d, err := limiter.TakeBy(s.backend, ctx, end, now, reqs)
	var de *limiter.DeadlineError
	if err != nil && errors.As(err, &de) {
		s.noteLateness(max(time.Since(end), 0))
	}
	return d, err
}

// noteLateness adds late, how long past its budget's end a call came
// back, to the estimate (see Store.lateness).
func (s *Store) noteLateness(late time.Duration) {
	now := time.Now()
	for {
		cur := s.lateness.Load()
		decayed := int64(s.lateNow(now))
		next := int64(late)
		if next < decayed {
			next = decayed - (decayed-next)/16
		}
		if s.lateness.CompareAndSwap(cur, next) {
			s.lateAt.Store(now.UnixNano())
			return
		}
	}
}
