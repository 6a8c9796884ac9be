package failover

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestGaveUpIsCanceledOnlyWithTimeLeft: a caller's context cancelled with
// time left is a cancellation; one cancelled at its deadline (a gRPC
// stream reset by a client whose deadline passed) or past it is a
// deadline, never read as context.Canceled.
func TestGaveUpIsCanceledOnlyWithTimeLeft(t *testing.T) {
	backend := &limiter.DeadlineError{InFlight: 3 * time.Millisecond, Err: context.Canceled}
	for _, tc := range []struct {
		name         string
		left         time.Duration // until the context's deadline; 0: none
		cancel       bool
		wantCanceled bool
	}{
		{"cancelled with a second left", time.Second, true, true},
		{"cancelled without a deadline", 0, true, true},
		{"cancelled 2ms before its deadline", 2 * time.Millisecond, true, false},
		{"cancelled as its deadline passed", -time.Millisecond, true, false},
		{"its deadline passed", -time.Millisecond, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			var cancel context.CancelFunc
			if tc.left != 0 {
				ctx, cancel = context.WithDeadline(ctx, time.Now().Add(tc.left))
			} else {
				ctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			if tc.cancel {
				cancel()
			}
			if tc.left < 0 {
				<-ctx.Done()
			}
			err := gaveUp(ctx, backend)
			if got := errors.Is(err, context.Canceled); got != tc.wantCanceled {
				t.Errorf("gaveUp(%s) = %v: errors.Is(context.Canceled) = %v, want %v", tc.name, err, got, tc.wantCanceled)
			}
			if !tc.wantCanceled && !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("gaveUp(%s) = %v, want context.DeadlineExceeded", tc.name, err)
			}
		})
	}
}

// TestErrorOfHidesTheBackendsContextErrors: failure mode error's answer
// for an outage whose error holds a context's error (not the caller's,
// who still waits) is UNAVAILABLE's, never a cancellation or deadline.
func TestErrorOfHidesTheBackendsContextErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		overloaded bool
	}{
		{"a dial failed with context canceled", fmt.Errorf("%w: dial: %w", limiter.ErrUnavailable, context.Canceled), false},
		{"a round trip held past the timeout", &limiter.DeadlineError{InFlight: 20 * time.Millisecond, Pending: true, Err: context.DeadlineExceeded}, false},
		{"overloaded", fmt.Errorf("%w: %w", limiter.ErrOverloaded, &limiter.DeadlineError{Queued: time.Millisecond, Err: context.DeadlineExceeded}), true},
		{"connection refused", fmt.Errorf("%w: connection refused", limiter.ErrUnavailable), false},
	} {
		err := errorOf(outage{err: tc.err})
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("errorOf(%s) = %v: reads as a context's error", tc.name, err)
		}
		if got := errors.Is(err, limiter.ErrOverloaded); got != tc.overloaded {
			t.Errorf("errorOf(%s) = %v: overloaded %v, want %v", tc.name, err, got, tc.overloaded)
		}
		if !tc.overloaded && !errors.Is(err, limiter.ErrUnavailable) {
			t.Errorf("errorOf(%s) = %v, want ErrUnavailable", tc.name, err)
		}
	}
}
