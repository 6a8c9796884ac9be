package failover_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// backend is a hand-written limiter.Store whose health the test sets.
type backend struct {
	mu    sync.Mutex
	state string // "up", "down" or "hung"
	calls int
	mem   *limiter.MemoryStore
}

func newBackend() *backend {
	return &backend{state: "up", mem: limiter.NewMemoryStore(limiter.MemoryOptions{})}
}

func (b *backend) set(state string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state = state
}

func (b *backend) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

func (b *backend) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	b.mu.Lock()
	b.calls++
	state := b.state
	b.mu.Unlock()
	switch state {
	case "down":
		return nil, fmt.Errorf("fake: %w: connection refused", limiter.ErrUnavailable)
	case "hung":
		<-ctx.Done()
		return nil, fmt.Errorf("fake: %w: %w", limiter.ErrUnavailable, ctx.Err())
	}
	return b.mem.Take(ctx, now, reqs)
}

var (
	t0      = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	tenMin  = limiter.Limit{Count: 10, Period: time.Minute, Burst: 10}
	oneReq  = []limiter.Request{{Key: "k", Limit: tenMin, Hits: 1}}
	unavail = limiter.ErrUnavailable
)

func newStore(t *testing.T, b *backend, opts failover.Options) (*failover.Store, *clocktest.Clock) {
	t.Helper()
	clk := clocktest.New()
	clk.Set(t0)
	opts.Now = clk.Now
	s, err := failover.New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

func TestErrorModeAndBreaker(t *testing.T) {
	b := newBackend()
	var changes []string
	s, clk := newStore(t, b, failover.Options{Mode: failover.Error, FailureThreshold: 3, FailingFor: 20 * time.Millisecond, OpenFor: time.Second,
		OnChange: func(healthy bool, err error) { changes = append(changes, fmt.Sprint(healthy)) }})
	ctx := context.Background()
	if _, err := s.Take(ctx, t0, oneReq); err != nil {
		t.Fatalf("backend up: %v", err)
	}
	b.set("down")
	for i := range 5 {
		if _, err := s.Take(ctx, t0, oneReq); !errors.Is(err, unavail) {
			t.Fatalf("down, call %d: %v, want ErrUnavailable", i+1, err)
		}
		if i < 2 {
			clk.Advance(10 * time.Millisecond)
		}
	}
	if got := b.Calls(); got != 1+3 {
		t.Errorf("backend called %d times, want 4: the breaker opens after 3 failures over 20ms", got)
	}
	if s.Healthy() {
		t.Error("Healthy() = true during the outage")
	}
	clk.Advance(999 * time.Millisecond)
	s.Take(ctx, t0, oneReq)
	if got := b.Calls(); got != 4 {
		t.Errorf("before OpenFor elapsed the backend was called (%d calls)", got)
	}
	clk.Advance(time.Millisecond)
	s.Take(ctx, t0, oneReq) // the probe fails: open again
	s.Take(ctx, t0, oneReq)
	if got := b.Calls(); got != 5 {
		t.Errorf("half-open: %d calls, want exactly one probe (5)", got)
	}
	b.set("up")
	clk.Advance(time.Second)
	if _, err := s.Take(ctx, t0, oneReq); err != nil {
		t.Fatalf("probe after recovery: %v", err)
	}
	if _, err := s.Take(ctx, t0, oneReq); err != nil || b.Calls() != 7 {
		t.Errorf("after recovery: %v, %d calls; want the backend used again", err, b.Calls())
	}
	if fmt.Sprint(changes) != "[false true]" {
		t.Errorf("OnChange calls = %v, want [false true]", changes)
	}
}

// TestBreakerNeedsFailuresThatLast: failures that all land at once (one
// slow batch) do not open the breaker however many they are, and a success
// starts the count again; failures that go on for FailingFor do, once
// FailureThreshold of them have failed.
func TestBreakerNeedsFailuresThatLast(t *testing.T) {
	b := newBackend()
	s, clk := newStore(t, b, failover.Options{Mode: failover.Error, FailureThreshold: 3, FailingFor: 20 * time.Millisecond})
	ctx := context.Background()
	b.set("down")
	for range 64 {
		s.Take(ctx, t0, oneReq)
	}
	if got := b.Calls(); got != 64 {
		t.Errorf("64 failures at one instant: backend called %d times, want all 64 (breaker closed)", got)
	}
	step := func(state string, wantCalls int, why string) {
		t.Helper()
		clk.Advance(10 * time.Millisecond)
		b.set(state)
		s.Take(ctx, t0, oneReq)
		if got := b.Calls(); got != wantCalls {
			t.Errorf("%s: backend called %d times in all, want %d", why, got, wantCalls)
		}
	}
	step("up", 65, "a success")
	step("down", 66, "failure 1")
	step("down", 67, "failure 2, 10ms on")
	step("up", 68, "a success between")
	step("down", 69, "failure 1 again")
	step("down", 70, "failure 2 again, 10ms on")
	step("down", 71, "failure 3, 20ms on: opens")
	step("down", 71, "open")
	if s.Healthy() {
		t.Error("Healthy() = true with the breaker open")
	}

	// With the backend down all along: when failures open the breaker.
	type call struct {
		advance   time.Duration // on the clock before it
		wantCalls int           // backend calls in all after it
	}
	for _, tc := range []struct {
		name  string
		opts  failover.Options
		calls []call
	}{
		// FailingFor unset: twice Timeout, open from 20ms on.
		{"default FailingFor (2 × 10ms)", failover.Options{FailureThreshold: 1, Timeout: 10 * time.Millisecond},
			[]call{{0, 1}, {15 * time.Millisecond, 2}, {5 * time.Millisecond, 3}, {0, 3}}},
		// Failures that last are not enough alone: FailureThreshold of them
		// must fail (the second, 30ms on, is below it; the third opens).
		{"threshold 3", failover.Options{FailureThreshold: 3, FailingFor: 20 * time.Millisecond},
			[]call{{0, 1}, {30 * time.Millisecond, 2}, {0, 3}, {0, 3}}},
	} {
		b := newBackend()
		tc.opts.Mode = failover.Error
		s, clk := newStore(t, b, tc.opts)
		b.set("down")
		for i, st := range tc.calls {
			clk.Advance(st.advance)
			s.Take(ctx, t0, oneReq)
			if got := b.Calls(); got != st.wantCalls {
				t.Errorf("%s, call %d: backend called %d times in all, want %d", tc.name, i+1, got, st.wantCalls)
			}
		}
	}
}

// TestModesWhileDown: each mode's answer while the backend is down. The
// breaker opens at the third failure (FailingFor -1: at once); deny mode's
// RetryAfter is then exactly the time until the breaker tries the backend
// again, and before that the 1s minimum.
func TestModesWhileDown(t *testing.T) {
	tests := []struct {
		mode      failover.Mode
		wantErr   bool
		wantAllow bool
	}{
		{failover.Error, true, false},
		{failover.Allow, false, true},
		{failover.Deny, false, false},
	}
	calls := []struct {
		advance   time.Duration // before the call
		wantRetry time.Duration // deny mode's RetryAfter
	}{
		{0, time.Second}, // breaker closed: the minimum
		{0, time.Second},
		{0, 3 * time.Second}, // opens for OpenFor
		{500 * time.Millisecond, 2500 * time.Millisecond},
		{500 * time.Millisecond, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			b := newBackend()
			b.set("down")
			s, clk := newStore(t, b, failover.Options{Mode: tt.mode, FailingFor: -1, OpenFor: 3 * time.Second})
			for i, call := range calls {
				clk.Advance(call.advance)
				d, err := s.Take(context.Background(), t0, oneReq)
				if (err != nil) != tt.wantErr {
					t.Fatalf("call %d: error %v, want error %v", i+1, err, tt.wantErr)
				}
				if err != nil {
					continue
				}
				if d[0].Allowed != tt.wantAllow {
					t.Errorf("call %d: Allowed = %v, want %v", i+1, d[0].Allowed, tt.wantAllow)
				}
				if tt.mode == failover.Deny && d[0].RetryAfter != call.wantRetry {
					t.Errorf("call %d: denied with RetryAfter %v, want %v", i+1, d[0].RetryAfter, call.wantRetry)
				}
			}
			if got := b.Calls(); got != 3 {
				t.Errorf("backend called %d times, want 3: the breaker opens at the third failure", got)
			}
			if s.Fallbacks() != 5 {
				t.Errorf("Fallbacks() = %d, want 5", s.Fallbacks())
			}
		})
	}
}

func TestLocalModeAfterGrace(t *testing.T) {
	b := newBackend()
	b.set("down")
	s, clk := newStore(t, b, failover.Options{Mode: failover.Local, ReplicasHint: 2, Grace: 2 * time.Second, GraceMode: failover.Allow})
	ctx := context.Background()
	for range 20 {
		if d, err := s.Take(ctx, t0, oneReq); err != nil || !d[0].Allowed {
			t.Fatalf("during grace: %v %v, want allowed (grace mode allow)", d, err)
		}
	}
	clk.Advance(2 * time.Second)
	admitted := 0
	for range 20 {
		d, err := s.Take(ctx, clk.Now(), oneReq)
		if err != nil {
			t.Fatal(err)
		}
		if d[0].Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("local mode, 10/min burst 10 over 2 replicas: %d of 20 admitted, want 5", admitted)
	}
}

func TestTimeoutBoundsAHungBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBackend()
		b.set("hung")
		s, err := failover.New(b, failover.Options{Mode: failover.Deny, Timeout: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		d, err := s.Take(context.Background(), start, oneReq)
		if err != nil || d[0].Allowed {
			t.Fatalf("hung backend in deny mode: %v %v, want a denial", d, err)
		}
		if took := time.Since(start); took != 5*time.Millisecond {
			t.Errorf("answered after %v, want exactly the 5ms timeout", took)
		}
	})
}

func TestOneProbeAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBackend()
		b.set("down")
		s, err := failover.New(b, failover.Options{Mode: failover.Allow, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second, Timeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s.Take(context.Background(), time.Now(), oneReq) // opens the breaker
		time.Sleep(time.Second)
		b.set("hung")
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { s.Take(context.Background(), time.Now(), oneReq) })
		}
		wg.Wait()
		if got := b.Calls(); got != 2 {
			t.Errorf("50 calls while half-open: backend called %d times, want 2 (one failure, one probe)", got)
		}
	})
}

func TestNeitherBadRequestsNorCancelledCallersTripTheBreaker(t *testing.T) {
	b := newBackend()
	s, _ := newStore(t, b, failover.Options{FailureThreshold: 1, FailingFor: -1})
	bad := []limiter.Request{{Key: "k", Limit: tenMin, Hits: -1}}
	if _, err := s.Take(context.Background(), t0, bad); !errors.Is(err, limiter.ErrInvalidRequest) {
		t.Errorf("bad request: %v, want ErrInvalidRequest", err)
	}
	b.set("hung")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, t0, oneReq); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v, want context.Canceled", err)
	}
	if !s.Healthy() {
		t.Error("the breaker counted a caller's cancellation as a backend failure")
	}
}
