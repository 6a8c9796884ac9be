package failover

import (
	"context"
	"errors"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// Margins kept between a call's budget and its caller's deadline, for the
// failure mode's answer to reach the caller: a fifth of the time left (4ms
// of Envoy's 20ms), at most maxMargin; or, on a host where calls come
// back from the backend later than their budget's end (a busy CPU wakes
// the timers late), twice that lateness as lately seen (see
// Store.lateness, and Options.TimerLateness, how late this process's
// timers fire), up to a quarter of the time left (5ms of 20ms). A third
// (6.7ms) left fewer answers late in the fault suite, but on a healthy
// Redis beside a CPU burner it cut the calls' time for Redis so much
// that 5 in 3,268 fell back as overloaded (TestClusterUnderLoad, 1 run
// in 5): a late answer at a fault's onset is rarer than a busy host.
//
// Why a fifth: the budget's timer itself fires late. The Go runtime's
// netpoller sleeps in whole milliseconds (runtime/netpoll_epoll.go), so
// on an idle process a timer fires up to about 1ms late, and at a fault's
// onset every call in flight expires at once. Measured on the project's
// 2-core machine, a standalone Redis black-holed under load: the calls in
// flight came back from the backend up to 1.9ms past their budget's end
// and their answers took another 0.1-0.5ms to reach the client, so with a
// tenth (2ms), one in about a hundred reached the client past its
// deadline; with 1ms, one in a hundred did on an idle host with no fault.
const (
	marginDivisor    = 5
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
	late := s.lateNow(now)
	if s.opts.TimerLateness != nil {
		late = max(late, s.opts.TimerLateness(now))
	}
	if late := 2 * late; late > margin {
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
