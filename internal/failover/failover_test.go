package failover_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/clocktest"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// backend is a hand-written limiter.Store and limiter.Refunder whose
// health the test sets. As redisstore does, it answers a call its context
// ends on with a *limiter.DeadlineError saying how long it had it.
type backend struct {
	fakeStore
	state string // "up", "down", "hung" (sent, never answered) or "queued" (never sent)
	// queueDelay is how long an "up" call waits before it is sent (a busy
	// batch queue); the backend then answers at once.
	queueDelay time.Duration
	refunds    int // Refund calls
	pings      int // Ping calls
}

// fakeStore is what the hand-written stores share: a lock for their
// fields, the count of Take calls, and the in-memory buckets that decide
// the calls they let through.
type fakeStore struct {
	mu    sync.Mutex
	calls int
	mem   *limiter.MemoryStore
}

func newFakeStore() fakeStore {
	return fakeStore{mem: limiter.NewMemoryStore(limiter.MemoryOptions{})}
}

// Calls is how many Take calls the store had.
func (f *fakeStore) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func newBackend() *backend {
	return &backend{state: "up", fakeStore: newFakeStore()}
}

func (b *backend) set(state string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state = state
}

func (b *backend) Take(ctx context.Context, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	b.mu.Lock()
	b.calls++
	state, delay := b.state, b.queueDelay
	b.mu.Unlock()
	if err := b.wait(ctx, state, delay); err != nil {
		return nil, err
	}
	return b.mem.Take(ctx, now, reqs)
}

// wait is a call's time before the backend answers in state: an error
// for "down", the context's end for "hung" and "queued", delay (or the
// context's end, first) for "up".
func (b *backend) wait(ctx context.Context, state string, delay time.Duration) error {
	start := time.Now()
	switch state {
	case "down":
		return fmt.Errorf("fake: %w: connection refused", limiter.ErrUnavailable)
	case "hung":
		<-ctx.Done()
		return fmt.Errorf("fake: %w", &limiter.DeadlineError{InFlight: time.Since(start), Err: ctx.Err()})
	case "queued":
		<-ctx.Done()
		return fmt.Errorf("fake: %w", &limiter.DeadlineError{Queued: time.Since(start), Err: ctx.Err()})
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("fake: %w", &limiter.DeadlineError{Queued: time.Since(start), Err: ctx.Err()})
		}
	}
	return nil
}

func (b *backend) Refund(ctx context.Context, now time.Time, reqs []limiter.Request) error {
	b.mu.Lock()
	b.refunds++
	b.mu.Unlock()
	return b.mem.Refund(ctx, now, reqs)
}

// Ping is the backend's health check, for Options.Probe: it answers as
// Take does.
func (b *backend) Ping(ctx context.Context) error {
	b.mu.Lock()
	b.pings++
	state, delay := b.state, b.queueDelay
	b.mu.Unlock()
	return b.wait(ctx, state, delay)
}

func (b *backend) Pings() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pings
}

func (b *backend) Refunds() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refunds
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
		// FailingFor unset: Timeout, open from 10ms on.
		{"default FailingFor (Timeout, 10ms)", failover.Options{FailureThreshold: 1, Timeout: 10 * time.Millisecond},
			[]call{{0, 1}, {5 * time.Millisecond, 2}, {5 * time.Millisecond, 3}, {0, 3}}},
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

// heldBackend fails every Take at once as a backend that held it for
// held (a *limiter.DeadlineError), and counts the calls.
type heldBackend struct {
	limiter.Store
	held  time.Duration
	calls atomic.Int64
}

func (b *heldBackend) Take(context.Context, time.Time, []limiter.Request) ([]limiter.Decision, error) {
	b.calls.Add(1)
	return nil, &limiter.DeadlineError{InFlight: b.held, Pending: true, Err: context.DeadlineExceeded}
}

// TestHeldFailuresOpenWithinTwoTimeouts: a backend that holds every call
// (a black hole) has its first held call reported a Timeout after it was
// sent, and the breaker, with the default FailingFor (Timeout), opens a
// Timeout after that: 20ms after the fault began, within three Timeouts.
func TestHeldFailuresOpenWithinTwoTimeouts(t *testing.T) {
	b := &heldBackend{Store: limiter.NewMemoryStore(limiter.MemoryOptions{}), held: 10 * time.Millisecond}
	clk := clocktest.New()
	clk.Set(t0)
	s, err := failover.New(b, failover.Options{Mode: failover.Error, Timeout: 10 * time.Millisecond, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range []struct {
		at        time.Duration // since the first call was sent
		wantCalls int64
	}{
		{10 * time.Millisecond, 1}, // held since 0, reported now
		{15 * time.Millisecond, 2},
		{19 * time.Millisecond, 3}, // 3 failures over 9ms
		{20 * time.Millisecond, 4}, // over 10ms (20ms since the fault began): opens
		{21 * time.Millisecond, 4},
	} {
		clk.Set(t0.Add(st.at))
		_, err := s.Take(context.Background(), t0, oneReq)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, unavail) {
			t.Errorf("call %d at %v: %v, want the failure mode's error", i+1, st.at, err)
		}
		if got := b.calls.Load(); got != st.wantCalls {
			t.Errorf("call %d at %v: backend called %d times in all, want %d", i+1, st.at, got, st.wantCalls)
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

// deadlineBackend is backend as a limiter.DeadlineTaker: TakeBy records
// the by and the context it is given, then is Take under that context
// ending at by.
type deadlineBackend struct {
	*backend
	mu  sync.Mutex
	by  []time.Time
	ctx []context.Context
}

func (b *deadlineBackend) TakeBy(ctx context.Context, by, now time.Time, reqs []limiter.Request) ([]limiter.Decision, error) {
	b.mu.Lock()
	b.by, b.ctx = append(b.by, by), append(b.ctx, ctx)
	b.mu.Unlock()
	ctx, cancel := context.WithDeadline(ctx, by)
	defer cancel()
	return b.Take(ctx, now, reqs)
}

// TestTheBudgetBoundsAHungBackend: a call to a backend that never answers
// is answered per the failure mode when its budget runs out: a margin
// before the caller's deadline (a fifth of the time left, at most 5ms), or
// DefaultDeadline after it came without one; the backend had it for its
// whole Timeout, so it failed. A backend that is a limiter.DeadlineTaker
// is given the budget's end as by, with the caller's own context (none is
// made for the call); any other, a context that ends then.
func TestTheBudgetBoundsAHungBackend(t *testing.T) {
	for _, tt := range []struct {
		name     string
		deadline time.Duration // 0: none
		want     time.Duration
	}{
		{"Envoy's 20ms", 20 * time.Millisecond, 16 * time.Millisecond},
		{"2s", 2 * time.Second, 2*time.Second - 5*time.Millisecond},
		{"none", 0, 300 * time.Millisecond},
	} {
		for _, taker := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/DeadlineTaker=%v", tt.name, taker), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					b := newBackend()
					b.set("hung")
					var store limiter.Store = b
					db := &deadlineBackend{backend: b}
					if taker {
						store = db
					}
					s, err := failover.New(store, failover.Options{Mode: failover.Deny, Timeout: 5 * time.Millisecond, DefaultDeadline: 300 * time.Millisecond})
					if err != nil {
						t.Fatal(err)
					}
					ctx := context.Background()
					if tt.deadline > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tt.deadline)
						defer cancel()
					}
					start := time.Now()
					d, err := s.Take(ctx, start, oneReq)
					if err != nil || d[0].Allowed || d[0].Fallback != limiter.FallbackBackendFailed {
						t.Fatalf("hung backend in deny mode: %+v %v, want a denial by the failure mode, the backend failed", d, err)
					}
					if took := time.Since(start); took != tt.want {
						t.Errorf("answered after %v, want exactly %v", took, tt.want)
					}
					if !taker {
						return
					}
					if len(db.by) != 1 || !db.by[0].Equal(start.Add(tt.want)) {
						t.Errorf("TakeBy given by %v, want %v", db.by, start.Add(tt.want))
					}
					if len(db.ctx) == 1 && db.ctx[0] != ctx {
						t.Error("TakeBy given a context other than the caller's")
					}
				})
			})
		}
	}
}

// dueForProbe returns a Store in allow mode over b (with check as
// Options.Probe) whose breaker a failing call opened OpenFor (1 s) ago, so
// that the next call or Probe probes, and leaves b hung (each call waits
// for its 100 ms Timeout). It must run in a synctest bubble.
func dueForProbe(t *testing.T, b *backend, check func(context.Context) error) *failover.Store {
	t.Helper()
	b.set("down")
	s, err := failover.New(b, failover.Options{Mode: failover.Allow, FailureThreshold: 1, FailingFor: -1,
		OpenFor: time.Second, Timeout: 100 * time.Millisecond, Probe: check})
	if err != nil {
		t.Fatal(err)
	}
	s.Take(context.Background(), time.Now(), oneReq) // opens the breaker
	time.Sleep(time.Second)
	b.set("hung")
	return s
}

func TestOneProbeAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBackend()
		s := dueForProbe(t, b, nil)
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

// TestCallerDeadline: a backend call cut short by its budget (the
// caller's deadline less a margin) or by the caller counts as a backend
// failure only when the backend had had it for Timeout; otherwise the
// process is to blame (ErrOverloaded). A caller still waiting gets the
// failure mode's answer; one that has gone gets the error.
func TestCallerDeadline(t *testing.T) {
	tests := []struct {
		name        string
		state       string        // the backend's
		deadline    time.Duration // the caller's, from the call; 0: cancelled before; below -1ns: cancelled after -deadline
		wantErr     error         // nil: answered per the mode
		wantCause   limiter.Fallback
		wantCounted bool
	}{
		{"cancelled", "hung", 0, context.Canceled, 0, false},
		{"cancelled after 5ms, under Timeout", "hung", -5 * time.Millisecond, context.Canceled, 0, false},
		{"cancelled after 15ms (Envoy's timeout resets the stream)", "hung", -15 * time.Millisecond, context.Canceled, 0, true},
		{"deadline passed already", "hung", -time.Nanosecond, context.DeadlineExceeded, 0, false},
		{"5ms left, under Timeout", "hung", 5 * time.Millisecond, nil, limiter.FallbackOverloaded, false},
		{"12ms left: a budget of 9.6ms, under Timeout", "hung", 12 * time.Millisecond, nil, limiter.FallbackOverloaded, false},
		{"13ms left: a budget of 10.4ms, over Timeout", "hung", 13 * time.Millisecond, nil, limiter.FallbackBackendFailed, true},
		{"20ms left", "hung", 20 * time.Millisecond, nil, limiter.FallbackBackendFailed, true},
		{"20ms left, queued all along", "queued", 20 * time.Millisecond, nil, limiter.FallbackOverloaded, false},
		{"2s left, queued all along", "queued", 2 * time.Second, nil, limiter.FallbackOverloaded, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBackend()
				b.set(tt.state)
				s, err := failover.New(b, failover.Options{Mode: failover.Allow, Timeout: 10 * time.Millisecond, FailureThreshold: 1, FailingFor: -1})
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				switch {
				case tt.deadline == 0:
					cancel()
				case tt.deadline < -time.Nanosecond: // cancelled that long after the call
					time.AfterFunc(-tt.deadline, cancel)
				default:
					ctx, cancel = context.WithTimeout(context.Background(), tt.deadline)
				}
				defer cancel()
				d, err := s.Take(ctx, time.Now(), oneReq)
				if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
					t.Errorf("Take = %v, want %v", err, tt.wantErr)
				}
				if err == nil && (!d[0].Allowed || d[0].Fallback != tt.wantCause) {
					t.Errorf("Take = %+v, want allowed per the mode because %v", d[0], tt.wantCause)
				}
				if counted := errors.Is(err, limiter.ErrOverloaded); err != nil && counted == tt.wantCounted {
					t.Errorf("Take = %v: wraps ErrOverloaded %v, want %v", err, counted, !tt.wantCounted)
				}
				if s.Healthy() == tt.wantCounted {
					t.Errorf("Healthy() = %v after the call, want %v (counted as a failure: %v)", s.Healthy(), !tt.wantCounted, tt.wantCounted)
				}
				// Counted, the failure opened the breaker: the next call is
				// answered per the mode without the backend.
				d, err = s.Take(context.Background(), time.Now(), oneReq)
				if err != nil || !d[0].Allowed {
					t.Fatalf("next call: %v %v, want allowed", d, err)
				}
				wantCalls := 2
				if tt.wantCounted {
					wantCalls = 1
				}
				if got := b.Calls(); got != wantCalls {
					t.Errorf("backend called %d times, want %d", got, wantCalls)
				}
			})
		})
	}
}

// TestASlowQueueWithAFastBackend: calls that wait in the process (a busy
// batch queue, 15ms here) for a backend that then answers at once are
// decided by the backend whenever their deadline allows, whatever
// Options.Timeout; the breaker stays closed and nothing falls back. Those
// whose deadline does not allow it are answered per the failure mode as
// overloaded, which the breaker does not count either.
func TestASlowQueueWithAFastBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBackend()
		b.queueDelay = 15 * time.Millisecond
		var failures, fallbacks []string
		var mu sync.Mutex
		s, err := failover.New(b, failover.Options{Mode: failover.Deny, Timeout: time.Millisecond, FailureThreshold: 1, FailingFor: -1,
			OnBackendFailure: func(err error) { mu.Lock(); failures = append(failures, err.Error()); mu.Unlock() },
			OnFallback:       func(c limiter.Fallback) { mu.Lock(); fallbacks = append(fallbacks, c.String()); mu.Unlock() },
		})
		if err != nil {
			t.Fatal(err)
		}
		lots := limiter.Limit{Count: 1_000_000, Period: time.Second, Burst: 1_000_000}
		var wg sync.WaitGroup
		var decided, overloaded sync.Map
		for i := range 200 {
			deadline := 20 * time.Millisecond // Envoy's default: room for the queue
			if i%10 == 0 {
				deadline = 10 * time.Millisecond // too short for it
			}
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				d, err := s.Take(ctx, time.Now(), []limiter.Request{{Key: fmt.Sprint(i), Limit: lots, Hits: 1}})
				switch {
				case err != nil:
					t.Errorf("call %d (deadline %v): %v, want an answer", i, deadline, err)
				case d[0].Fallback == limiter.FallbackNone && d[0].Allowed:
					decided.Store(i, deadline)
				case d[0].Fallback == limiter.FallbackOverloaded:
					overloaded.Store(i, deadline)
				default:
					t.Errorf("call %d (deadline %v): %+v", i, deadline, d[0])
				}
			})
		}
		wg.Wait()
		decided.Range(func(k, v any) bool {
			if v.(time.Duration) != 20*time.Millisecond {
				t.Errorf("call %v with a %v deadline was decided by the backend after a 15ms queue", k, v)
			}
			return true
		})
		n := 0
		overloaded.Range(func(k, v any) bool {
			n++
			if v.(time.Duration) != 10*time.Millisecond {
				t.Errorf("call %v with a %v deadline fell back, want it decided by the backend", k, v)
			}
			return true
		})
		if n != 20 || len(fallbacks) != 20 {
			t.Errorf("%d calls (%d OnFallback) answered as overloaded, want the 20 with 10ms deadlines", n, len(fallbacks))
		}
		if !s.Healthy() || len(failures) > 0 {
			t.Errorf("Healthy() = %v, backend failures %v; want the breaker closed, none", s.Healthy(), failures)
		}
	})
}

// TestHealthChangesWithTheBreaker: OnChange and Healthy report the backend
// failing when the breaker opens, not at each failure, and working again at
// the first success after that; isolated failures (one slow batch) report
// nothing, so health does not flap under load.
func TestHealthChangesWithTheBreaker(t *testing.T) {
	type step struct {
		advance     time.Duration // on the clock before the call
		state       string        // the backend's
		wantChanges string        // OnChange calls so far
		wantHealthy bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"isolated failures", []step{
			{0, "down", "[]", true},
			{0, "up", "[]", true},
			{10 * time.Millisecond, "down", "[]", true},
			{0, "up", "[]", true},
			{10 * time.Millisecond, "down", "[]", true},
			{10 * time.Millisecond, "down", "[]", true},
			{0, "up", "[]", true},
		}},
		{"a burst at one instant", []step{
			{0, "down", "[]", true},
			{0, "down", "[]", true},
			{0, "down", "[]", true},
			{0, "down", "[]", true},
			{10 * time.Millisecond, "up", "[]", true},
		}},
		{"an outage", []step{
			{0, "down", "[]", true},
			{10 * time.Millisecond, "down", "[]", true},
			{10 * time.Millisecond, "down", "[false]", false}, // 3 failures over 20ms: opens
			{time.Second, "down", "[false]", false},           // the probe fails: open again
			{time.Second, "up", "[false true]", true},         // the probe succeeds
			{0, "down", "[false true]", true},
			{0, "up", "[false true]", true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBackend()
			var changes []bool
			s, clk := newStore(t, b, failover.Options{Mode: failover.Error, FailureThreshold: 3, FailingFor: 20 * time.Millisecond, OpenFor: time.Second,
				OnChange: func(healthy bool, err error) { changes = append(changes, healthy) }})
			for i, st := range tt.steps {
				clk.Advance(st.advance)
				b.set(st.state)
				s.Take(context.Background(), t0, oneReq)
				if got := fmt.Sprint(changes); got != st.wantChanges {
					t.Errorf("call %d (%s): OnChange calls %s, want %s", i+1, st.state, got, st.wantChanges)
				}
				if s.Healthy() != st.wantHealthy {
					t.Errorf("call %d (%s): Healthy() = %v, want %v", i+1, st.state, s.Healthy(), st.wantHealthy)
				}
			}
		})
	}
}

// TestLocalModeKeepsPostPaidCharges: in Local mode a post-paid limit stays
// post-paid at its share: charges larger than what is left, or than the
// share's burst, are recorded (down to MaxDebt ÷ ReplicasHint below empty)
// rather than denied or ExceedsBurst, and checks are denied while in debt.
func TestLocalModeKeepsPostPaidCharges(t *testing.T) {
	tokens := limiter.Limit{Count: 1000, Period: time.Minute, Burst: 1000, MaxDebt: 5000}
	// ReplicasHint 10: 100/min, burst 100, max debt 500 locally.
	tests := []struct {
		hits        int64
		wantAllowed bool
		wantRetry   time.Duration
	}{
		{0, true, 0},
		{300, true, 0}, // above the share's burst: recorded, 200 in debt
		{0, false, 2 * time.Minute},
		{100, false, 3 * time.Minute}, // recorded: 300 in debt (Retry-After counts it)
		{0, false, 3 * time.Minute},
		{1000, false, 5 * time.Minute}, // recorded down to 500 in debt
		{0, false, 5 * time.Minute},
	}
	b := newBackend()
	b.set("down")
	s, _ := newStore(t, b, failover.Options{Mode: failover.Local, ReplicasHint: 10, FailureThreshold: 1, FailingFor: -1})
	for i, tt := range tests {
		req := []limiter.Request{{Key: "tok", Limit: tokens, Hits: tt.hits}}
		d, err := s.Take(context.Background(), t0, req)
		if err != nil {
			t.Fatalf("call %d, Take(hits %d): %v", i+1, tt.hits, err)
		}
		if d[0].Allowed != tt.wantAllowed || d[0].RetryAfter != tt.wantRetry || d[0].ExceedsBurst {
			t.Errorf("call %d, Take(hits %d) = %+v, want Allowed %v, RetryAfter %v", i+1, tt.hits, d[0], tt.wantAllowed, tt.wantRetry)
		}
	}
}

// TestLocalModeAcceptsEveryValidLimit: a share whose rounding would make it
// fill in more than limiter.MaxFill is cut to fit, so a valid limit is
// never InvalidArgument locally.
func TestLocalModeAcceptsEveryValidLimit(t *testing.T) {
	tests := []struct {
		name     string
		limit    limiter.Limit
		replicas int64
	}{
		// Count 2n−1 rounds down to 1 while the burst halves: the share
		// fills in 3/2 of MaxFill.
		{"count 3 over 2", limiter.Limit{Count: 3, Period: limiter.MaxFill / 2, Burst: 6}, 2},
		{"count 3 over 2, post-paid", limiter.Limit{Count: 3, Period: limiter.MaxFill / 4, Burst: 6, MaxDebt: 6}, 2},
		// One token alone takes more than MaxFill at count 1.
		{"count 4 over 8", limiter.Limit{Count: 4, Period: 2 * limiter.MaxFill, Burst: 1}, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.limit.Validate(); err != nil {
				t.Fatalf("the test's limit is invalid: %v", err)
			}
			b := newBackend()
			b.set("down")
			s, _ := newStore(t, b, failover.Options{Mode: failover.Local, ReplicasHint: tt.replicas})
			req := []limiter.Request{{Key: "k", Limit: tt.limit, Hits: 1}}
			if d, err := s.Take(context.Background(), t0, req); err != nil || !d[0].Allowed {
				t.Errorf("Take(%v) locally = %v, %v; want allowed", tt.limit, d, err)
			}
		})
	}
}

// TestRefundGoesWhereTheTokensWereTaken: a refund goes to the backend only
// if no call was answered without it within the refund's window (a held
// reservation's MaxWait plus 1s; for negative hits, the limit's fill time
// plus 1s), to the local buckets only if they answered within it and the
// backend did not, and is dropped otherwise.
func TestRefundGoesWhereTheTokensWereTaken(t *testing.T) {
	type take struct {
		advance time.Duration // on the clock before the call
		state   string        // the backend's: "up" answers, "down" fails
	}
	type test struct {
		name    string
		mode    failover.Mode
		takes   []take
		advance time.Duration // between the last take and the refund
		maxWait time.Duration // the refunded request's
		want    string        // "backend", "local" or "dropped"
	}
	tests := []test{
		{"backend answered", failover.Local, []take{{0, "up"}}, 100 * time.Millisecond, time.Second, "backend"},
		{"answered locally, breaker closed", failover.Local, []take{{0, "up"}, {3 * time.Second, "down"}}, 500 * time.Millisecond, time.Second, "local"},
		{"answered locally, backend answered since", failover.Local, []take{{0, "down"}, {0, "up"}}, 100 * time.Millisecond, time.Second, "dropped"},
		{"answered locally before the window", failover.Local, []take{{0, "down"}, {0, "up"}}, 1500 * time.Millisecond, 400 * time.Millisecond, "backend"},
		{"answered locally at the window's edge", failover.Local, []take{{0, "down"}, {0, "up"}}, 1399 * time.Millisecond, 400 * time.Millisecond, "dropped"},
		{"answered locally, breaker open", failover.Local, []take{{0, "down"}, {10 * time.Millisecond, "down"}, {10 * time.Millisecond, "down"}}, 0, time.Second, "local"},
		// Deny answers took nothing anywhere: the refund goes to the backend, which answered since.
		{"denied per the mode", failover.Deny, []take{{0, "down"}, {time.Second, "up"}}, 100 * time.Millisecond, time.Second, "backend"},
		{"negative hits, answered locally a minute before", failover.Local, []take{{0, "down"}, {0, "up"}}, time.Minute, 0, "dropped"},
		{"negative hits, answered locally 61s before", failover.Local, []take{{0, "down"}, {0, "up"}}, 61 * time.Second, 0, "backend"},
		{"clock stepped back", failover.Local, []take{{0, "down"}, {0, "up"}}, -time.Hour, time.Second, "dropped"},
	}
	// run plays tt's takes, then the refund if refund is set, and returns
	// how many refunds reached the backend and the tokens then left in the
	// local bucket (Local mode).
	run := func(t *testing.T, tt test, refund bool) (refunds int, tokens int64) {
		b := newBackend()
		s, clk := newStore(t, b, failover.Options{Mode: tt.mode, FailureThreshold: 3, FailingFor: 20 * time.Millisecond})
		for i, tk := range tt.takes {
			clk.Advance(tk.advance)
			b.set(tk.state)
			if _, err := s.Take(context.Background(), clk.Now(), oneReq); err != nil {
				t.Fatalf("take %d (%s): %v", i+1, tk.state, err)
			}
		}
		clk.Advance(tt.advance)
		if refund {
			req := []limiter.Request{{Key: "k", Limit: tenMin, Hits: 1, MaxWait: tt.maxWait}}
			if err := s.Refund(context.Background(), clk.Now(), req); err != nil {
				t.Fatalf("Refund: %v", err)
			}
		}
		if tt.mode != failover.Local {
			return b.Refunds(), 0
		}
		b.set("down")
		d, err := s.Take(context.Background(), clk.Now(), []limiter.Request{{Key: "k", Limit: tenMin}})
		if err != nil {
			t.Fatalf("local check: %v", err)
		}
		return b.Refunds(), d[0].Remaining
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refunds, with := run(t, tt, true)
			_, without := run(t, tt, false)
			got := "dropped"
			switch {
			case refunds > 0:
				got = "backend"
			case with > without:
				got = "local"
			}
			if got != tt.want {
				t.Errorf("the refund went to: %s, want %s (local tokens %d with it, %d without)", got, tt.want, with, without)
			}
		})
	}
}

// TestGraceSurvivesARacingSuccess: a call answered per the failure mode
// measures the grace from the first failure it saw, even when a success
// (here a probe made from OnChange, between the failure and the answer)
// ends the outage in between; it used to find no outage and limit locally
// at once. OnChange still reports the failure and then the recovery, one
// after the other.
func TestGraceSurvivesARacingSuccess(t *testing.T) {
	tests := []struct {
		grace       time.Duration
		wantAllowed bool // grace mode Deny denies; local buckets admit
	}{
		{2 * time.Second, false},
		{0, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint("grace ", tt.grace), func(t *testing.T) {
			b := newBackend()
			b.set("down")
			var s *failover.Store
			var clk interface{ Advance(time.Duration) }
			var changes []bool
			opts := failover.Options{Mode: failover.Local, Grace: tt.grace, GraceMode: failover.Deny,
				FailureThreshold: 1, FailingFor: -1, OpenFor: 10 * time.Millisecond,
				OnChange: func(healthy bool, err error) {
					if !healthy {
						clk.Advance(10 * time.Millisecond)
						b.set("up")
						if _, err := s.Take(context.Background(), t0, oneReq); err != nil {
							t.Errorf("probe from OnChange: %v", err)
						}
					}
					// Recorded last, as health is set last: the recovery
					// must not be reported inside (before the end of) the
					// report of the failure.
					changes = append(changes, healthy)
				}}
			s, clk = newStore(t, b, opts)
			d, err := s.Take(context.Background(), t0, oneReq)
			if err != nil || d[0].Allowed != tt.wantAllowed {
				t.Errorf("Take as the outage ends = %v, %v; want Allowed %v", d, err, tt.wantAllowed)
			}
			if got := fmt.Sprint(changes); got != "[false true]" {
				t.Errorf("OnChange calls %s, want [false true]", got)
			}
		})
	}
}

// TestProbeClosesTheBreakerWithoutCalls: with no call coming (health checks
// took the replica out of rotation), Probe pings the backend once the open
// breaker's OpenFor has passed, counting as the probing call would: a
// failure keeps it open another OpenFor, a success closes it and reports
// OnChange(true). It pings at no other time, and a ping is no call.
func TestProbeClosesTheBreakerWithoutCalls(t *testing.T) {
	type step struct {
		advance     time.Duration // on the clock before it
		state       string        // the backend's
		op          string        // "take" or "probe"
		wantErr     bool          // from Probe: it pinged and the ping failed
		wantPings   int           // in all, after it
		wantCalls   int           // Takes reaching the backend, in all
		wantChanges string        // OnChange calls so far
		wantHealthy bool
	}
	steps := []step{
		{0, "up", "probe", false, 0, 0, "[]", true},        // closed: nothing to do
		{0, "down", "take", false, 0, 1, "[false]", false}, // opens
		{0, "up", "probe", false, 0, 1, "[false]", false},  // within OpenFor
		{999 * time.Millisecond, "up", "probe", false, 0, 1, "[false]", false},
		{time.Millisecond, "down", "probe", true, 1, 1, "[false]", false}, // OpenFor passed: the probe fails
		{0, "up", "probe", false, 1, 1, "[false]", false},                 // open another OpenFor
		{0, "up", "take", false, 1, 1, "[false]", false},                  // answered per the mode
		{time.Second, "up", "probe", false, 2, 1, "[false true]", true},   // the probe succeeds
		{time.Second, "up", "probe", false, 2, 1, "[false true]", true},   // closed: nothing to do
		{0, "up", "take", false, 2, 2, "[false true]", true},              // the backend answers again
	}
	b := newBackend()
	var changes []bool
	s, clk := newStore(t, b, failover.Options{Mode: failover.Error, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second,
		Timeout: time.Hour, Probe: b.Ping, OnChange: func(healthy bool, err error) { changes = append(changes, healthy) }})
	for i, st := range steps {
		clk.Advance(st.advance)
		b.set(st.state)
		switch st.op {
		case "take":
			s.Take(context.Background(), t0, oneReq)
		case "probe":
			if err := s.Probe(context.Background()); (err != nil) != st.wantErr {
				t.Errorf("step %d: Probe() = %v, want an error: %v", i+1, err, st.wantErr)
			}
		}
		if got := b.Pings(); got != st.wantPings {
			t.Errorf("step %d (%s, %s): %d pings in all, want %d", i+1, st.op, st.state, got, st.wantPings)
		}
		if got := b.Calls(); got != st.wantCalls {
			t.Errorf("step %d (%s, %s): %d backend calls in all, want %d", i+1, st.op, st.state, got, st.wantCalls)
		}
		if got := fmt.Sprint(changes); got != st.wantChanges {
			t.Errorf("step %d (%s, %s): OnChange calls %s, want %s", i+1, st.op, st.state, got, st.wantChanges)
		}
		if s.Healthy() != st.wantHealthy {
			t.Errorf("step %d (%s, %s): Healthy() = %v, want %v", i+1, st.op, st.state, s.Healthy(), st.wantHealthy)
		}
	}
}

// TestProbeInBackground: with Options.ProbeInBackground, no call probes
// the open breaker, however long it has been open: each is answered per
// the mode without the backend, and only Probe's check closes it.
func TestProbeInBackground(t *testing.T) {
	b := newBackend()
	s, clk := newStore(t, b, failover.Options{Mode: failover.Deny, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second,
		Timeout: time.Hour, Probe: b.Ping, ProbeInBackground: true})
	b.set("down")
	s.Take(context.Background(), t0, oneReq) // opens the breaker
	b.set("up")
	clk.Advance(time.Hour)
	for i := range 3 {
		d, err := s.Take(context.Background(), t0, oneReq)
		if err != nil || d[0].Allowed || d[0].Fallback != limiter.FallbackBreakerOpen || b.Calls() != 1 {
			t.Fatalf("call %d an hour after the breaker opened: %+v %v, %d backend calls; want denied per the mode (breaker open), 1 call",
				i+1, d, err, b.Calls())
		}
	}
	if err := s.Probe(context.Background()); err != nil || !s.Healthy() || b.Pings() != 1 {
		t.Fatalf("Probe() = %v, Healthy() %v, %d pings; want nil, true, 1", err, s.Healthy(), b.Pings())
	}
	if d, err := s.Take(context.Background(), t0, oneReq); err != nil || !d[0].Allowed || d[0].Fallback != 0 || b.Calls() != 2 {
		t.Errorf("call after the probe: %+v %v, %d backend calls; want the backend's answer", d, err, b.Calls())
	}
	for _, opts := range []failover.Options{
		{ProbeInBackground: true},
		{ProbeInBackground: true, Probe: b.Ping, Shard: func(string) string { return "a" }},
	} {
		if _, err := failover.New(b, opts); err == nil {
			t.Errorf("New(ProbeInBackground, Probe set %v, Shard set %v) = nil error, want one: nothing would probe",
				opts.Probe != nil, opts.Shard != nil)
		}
	}
}

// TestProbeWithoutCheck: with no Options.Probe, Probe does nothing and the
// breaker waits for a call, as before.
func TestProbeWithoutCheck(t *testing.T) {
	b := newBackend()
	s, clk := newStore(t, b, failover.Options{FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second})
	b.set("down")
	s.Take(context.Background(), t0, oneReq)
	b.set("up")
	clk.Advance(time.Hour)
	if err := s.Probe(context.Background()); err != nil || s.Healthy() {
		t.Errorf("Probe() without Options.Probe = %v, Healthy() %v; want nil, false", err, s.Healthy())
	}
	if _, err := s.Take(context.Background(), t0, oneReq); err != nil || !s.Healthy() {
		t.Errorf("the probing call = %v, Healthy() %v; want nil, true", err, s.Healthy())
	}
}

// TestProbeIsTheOneProbe: a Probe and a probing call are never in flight
// together: while a call probes, Probe does not ping; while Probe pings,
// calls are answered per the mode without the backend.
func TestProbeIsTheOneProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBackend()
		s := dueForProbe(t, b, b.Ping)
		var wg sync.WaitGroup
		wg.Go(func() { s.Take(context.Background(), time.Now(), oneReq) }) // the probe: hangs until its Timeout
		synctest.Wait()
		if err := s.Probe(context.Background()); err != nil || b.Pings() != 0 {
			t.Errorf("Probe while a call probes = %v, %d pings; want nil, 0", err, b.Pings())
		}
		wg.Wait() // the probing call failed: open another second
		time.Sleep(time.Second)
		wg.Go(func() {
			if err := s.Probe(context.Background()); err == nil {
				t.Error("Probe of a hung backend = nil, want its timeout")
			}
		})
		synctest.Wait()
		calls := b.Calls()
		if d, err := s.Take(context.Background(), time.Now(), oneReq); err != nil || !d[0].Allowed || b.Calls() != calls {
			t.Errorf("Take while Probe pings = %v, %v, %d backend calls (was %d); want allowed per the mode, no call", d, err, b.Calls(), calls)
		}
		wg.Wait()
		if b.Pings() != 1 || s.Healthy() {
			t.Errorf("after a Probe timed out: %d pings, Healthy() %v; want 1, false", b.Pings(), s.Healthy())
		}
	})
}

// TestProbeHeldToThreeTimeouts: a Probe whose ctx has no deadline (the
// daemon's) of a backend that holds it gives up after three Timeouts, not
// a call's DefaultDeadline (a second): no other probe is admitted while it
// is in flight, so a node that comes back after a black hole would stay
// behind an open breaker for as long. The failed probe opens the breaker
// for another OpenFor; the Probe after it finds the backend back.
func TestProbeHeldToThreeTimeouts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBackend()
		s := dueForProbe(t, b, b.Ping) // Timeout 100ms, OpenFor 1s
		start := time.Now()
		if err := s.Probe(context.Background()); err == nil {
			t.Error("Probe of a hung backend = nil, want its timeout")
		}
		if took := time.Since(start); took != 300*time.Millisecond {
			t.Errorf("Probe of a hung backend took %v, want 300ms (3 × Timeout)", took)
		}
		b.set("up")
		time.Sleep(time.Second)
		if err := s.Probe(context.Background()); err != nil || !s.Healthy() {
			t.Errorf("Probe an OpenFor later = %v, Healthy() %v; want nil, true", err, s.Healthy())
		}
	})
}

// TestProbeCancelledAtOnce: a Probe whose ctx ends before the ping had a
// quarter of Timeout (a shutdown) tells nothing of the backend: the breaker
// stays open without another OpenFor, and the next Probe pings.
func TestProbeCancelledAtOnce(t *testing.T) {
	b := newBackend()
	s, clk := newStore(t, b, failover.Options{FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second, Timeout: time.Hour, Probe: b.Ping})
	b.set("down")
	s.Take(context.Background(), t0, oneReq)
	clk.Advance(time.Second)
	b.set("hung")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Probe(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Probe(cancelled) = %v, want context.Canceled", err)
	}
	b.set("up")
	if err := s.Probe(context.Background()); err != nil || !s.Healthy() || b.Pings() != 2 {
		t.Errorf("the next Probe = %v, Healthy() %v, %d pings in all; want nil, true, 2", err, s.Healthy(), b.Pings())
	}
}

// TestProbeIsNoAnswerForRefunds: in Local mode a Probe's successful ping
// closes the breaker but answered no call, so a refund of tokens the local
// buckets took still goes back to them (a call the backend answered would
// send it nowhere).
func TestProbeIsNoAnswerForRefunds(t *testing.T) {
	b := newBackend()
	s, clk := newStore(t, b, failover.Options{Mode: failover.Local, FailureThreshold: 1, FailingFor: -1, OpenFor: time.Second, Probe: b.Ping})
	one := limiter.Limit{Count: 1, Period: time.Minute, Burst: 1}
	req := []limiter.Request{{Key: "k", Limit: one, Hits: 1}}
	b.set("down")
	if d, err := s.Take(context.Background(), clk.Now(), req); err != nil || !d[0].Allowed {
		t.Fatalf("Take from the local buckets = %v, %v; want allowed", d, err)
	}
	clk.Advance(time.Second)
	b.set("up")
	if err := s.Probe(context.Background()); err != nil || !s.Healthy() {
		t.Fatalf("Probe() = %v, Healthy() %v; want nil, true", err, s.Healthy())
	}
	if err := s.Refund(context.Background(), clk.Now(), req); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	if b.Refunds() != 0 {
		t.Errorf("the refund went to the backend, which never took the token")
	}
	b.set("down") // back to the local buckets: the token is there again
	if d, err := s.Take(context.Background(), clk.Now(), req); err != nil || !d[0].Allowed {
		t.Errorf("local Take after the refund = %v, %v; want allowed (the refund reached the local bucket)", d, err)
	}
}
