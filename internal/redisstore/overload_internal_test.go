package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ratelimitd/ratelimitd/internal/denialcache"
	"github.com/ratelimitd/ratelimitd/internal/failover"
	"github.com/ratelimitd/ratelimitd/internal/redistest"
	"github.com/ratelimitd/ratelimitd/limiter"
)

// queueingStore is a Store on a real Redis, through Dial (so with its
// timeouts), whose every call is coalesced: one round trip is counted in
// flight all along, as when the process is busy, so that no call is sent
// directly and every batch collects latecomers for batchWait (that round
// trip never lands: the count is never taken back).
func queueingStore(t *testing.T, srv *redistest.Server, batchWait time.Duration, onAbandoned func(error)) *Store {
	t.Helper()
	var onBackend func(string, time.Duration, error)
	if onAbandoned != nil {
		onBackend = func(_ string, _ time.Duration, err error) { onAbandoned(err) }
	}
	s := dialedStore(t, srv.Addr, Options{Prefix: "overload:", BatchWait: batchWait, OnBackend: onBackend})
	s.server.batch.inflight.Add(1)
	t.Cleanup(func() { s.server.batch.inflight.Add(-1) })
	return s
}

// dialedStore is a Store made with opts over a client Dial makes for the
// Redis at addr (so with ratelimitd's timeouts), its scripts loaded
// (Prepare). Both are closed when the test ends.
func dialedStore(t *testing.T, addr string, opts Options) *Store {
	t.Helper()
	c, err := Dial(ClientOptions{URL: "redis://" + addr})
	if err != nil {
		t.Fatalf("Dial(%s): %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := New(c, opts)
	if err != nil {
		t.Fatalf("New(%+v): %v", opts, err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Prepare(context.Background()); err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	return s
}

// TestAQueuedCallIsStillDecidedByRedis: a call with Envoy's 20 ms deadline
// that waits 13 ms in this process (a batch collecting latecomers) for a
// Redis that answers in well under a millisecond is decided by Redis, not
// by the failure mode, and counts against nobody; one whose deadline the
// queue outlasts is answered per the failure mode as overloaded, and the
// breaker does not hear of it.
func TestAQueuedCallIsStillDecidedByRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := queueingStore(t, srv, 13*time.Millisecond, nil)
	var failures atomic.Int64
	fs, err := failover.New(s, failover.Options{Mode: failover.Deny, Timeout: 10 * time.Millisecond,
		FailureThreshold: 1, FailingFor: -1, OnBackendFailure: func(error) { failures.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Count: 1000, Period: time.Second, Burst: 1000}
	take := func(deadline time.Duration) ([]limiter.Decision, time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		d, err := fs.Take(ctx, start, []limiter.Request{{Key: "q", Limit: l, Hits: 1}})
		took := time.Since(start)
		// The sender collects for the rest of its 13ms: let it send, so
		// that the next call queues the whole 13ms again.
		time.Sleep(20 * time.Millisecond)
		return d, took, err
	}
	// A round trip takes a millisecond or two here (more under the race
	// detector on a busy machine, where the queue itself can outlast its
	// 13ms), which leaves 20ms - 4ms margin (failover's: a fifth) - 13ms:
	// two in five may miss it on bad moments, not more. (Counting the queue into a 10ms
	// backend timeout, as ratelimitd once did, misses every one.)
	// A call that queued less than 13ms (it found a batch already formed,
	// when a busy machine delayed the previous one's send past the pause
	// above) tells nothing of the queue: it is not counted, and another is
	// made, up to 10 calls for 5 that queued.
	missed, queued := 0, 0
	for try := 0; queued < 5 && try < 10; try++ {
		d, took, err := take(20 * time.Millisecond)
		t.Logf("20ms deadline: %+v, %v in %v", d, err, took)
		switch {
		case errors.Is(err, limiter.ErrOverloaded) || err == nil && d[0].Fallback == limiter.FallbackOverloaded:
			missed++
		case err != nil:
			t.Fatalf("Take with a 20ms deadline after a 13ms queue: %v, want an answer", err)
		case d[0].Fallback != limiter.FallbackNone || !d[0].Allowed:
			t.Errorf("Take with a 20ms deadline = %+v after %v, want decided by Redis after the 13ms queue", d[0], took)
		case took < 13*time.Millisecond:
			continue // did not queue: not counted
		}
		queued++
	}
	if queued < 5 {
		t.Errorf("%d of 10 calls queued 13ms, want 5", queued)
	}
	if missed > 2 {
		t.Errorf("%d of %d calls with a 20ms deadline after a 13ms queue fell back, want at most 2", missed, queued)
	}
	// A deadline the queue outlasts: answered per the failure mode (or, on a
	// machine too slow even for the margin, the error), overloaded.
	d, took, err := take(12 * time.Millisecond)
	if !errors.Is(err, limiter.ErrOverloaded) && (err != nil || d[0].Fallback != limiter.FallbackOverloaded) {
		t.Errorf("Take with a 12ms deadline after a 13ms queue = %+v, %v after %v; want overloaded", d, err, took)
	}
	if !fs.Healthy() || failures.Load() != 0 {
		t.Errorf("Healthy() %v, %d backend failures; want the breaker closed, none: the queue was ours", fs.Healthy(), failures.Load())
	}
}

// TestACancelledCallerIsNotCharged: a caller with a long deadline that
// cancels (a client gone) while its Take waits in the batch queue gets the
// cancellation back at once, and its bucket is not charged: the call is
// dropped before it is sent. (A budget context that did not pass the
// caller's cancellation on once sent such a call and charged it.)
func TestACancelledCallerIsNotCharged(t *testing.T) {
	srv := redistest.Start(t)
	s := queueingStore(t, srv, 30*time.Millisecond, nil)
	fs, err := failover.New(s, failover.Options{Mode: failover.Error, Timeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	time.AfterFunc(5*time.Millisecond, cancel)
	start := time.Now()
	d, err := fs.Take(ctx, start, []limiter.Request{{Key: "gone", Limit: l, Hits: 1}})
	took := time.Since(start)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Take cancelled after 5ms = %+v, %v; want an error wrapping context.Canceled", d, err)
	}
	if took >= 30*time.Millisecond {
		t.Errorf("Take cancelled after 5ms returned after %v, want before its batch went out (30ms)", took)
	}
	time.Sleep(40 * time.Millisecond) // the batch the call was queued in has gone out
	wantUncharged(t, s, "gone", l, "a cancelled Take")
}

// wantUncharged checks that the bucket of key and l is full after what
// was given up on (a check: Hits 0).
func wantUncharged(t *testing.T, s *Store, key string, l limiter.Limit, after string) {
	t.Helper()
	got, err := s.Take(context.Background(), time.Now(), []limiter.Request{{Key: key, Limit: l, Hits: 0}})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Remaining != l.Burst {
		t.Errorf("after %s, %d of %d tokens remain, want all: nothing charged", after, got[0].Remaining, l.Burst)
	}
}

// TestTakeByGivesUpAtBy: a Take whose by comes while it waits in the batch
// queue (every batch collects for 60ms here), its caller's deadline still
// far, returns at by a *limiter.DeadlineError wrapping
// context.DeadlineExceeded that says it was never sent, and is dropped
// before it is sent: no late answer, nothing charged. Two more in a row
// each give up at their own by (a pooled timer serves each anew), and one
// whose by the batch does not outlast is decided by Redis.
func TestTakeByGivesUpAtBy(t *testing.T) {
	srv := redistest.Start(t)
	s := queueingStore(t, srv, 60*time.Millisecond, nil)
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := s.Stats()
	for i, ahead := range []time.Duration{10 * time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		start := time.Now()
		d, err := s.TakeBy(ctx, start.Add(ahead), start, []limiter.Request{{Key: "late", Limit: l, Hits: 1}})
		took := time.Since(start)
		var de *limiter.DeadlineError
		if !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || de.InFlight != 0 {
			t.Fatalf("TakeBy %d, %v ahead of a 60ms batch = %+v, %v; want an unsent *limiter.DeadlineError wrapping DeadlineExceeded", i+1, ahead, d, err)
		}
		if took < ahead || took >= 60*time.Millisecond {
			t.Errorf("TakeBy %d, %v ahead, returned after %v; want at %v, before its batch went out (60ms)", i+1, ahead, took, ahead)
		}
	}
	d, err := s.TakeBy(ctx, time.Now().Add(time.Second), time.Now(), []limiter.Request{{Key: "in-time", Limit: l, Hits: 1}})
	if err != nil || !d[0].Allowed || d[0].Remaining != l.Burst-1 {
		t.Fatalf("TakeBy 1s ahead of a 60ms batch = %+v, %v; want decided by Redis", d, err)
	}
	time.Sleep(70 * time.Millisecond) // every batch the calls were queued in has gone out
	if st := s.Stats(); st.Calls-before.Calls != 1 || st.Late != before.Late {
		t.Errorf("Stats = %+v: want the one call in time sent, the three given up on dropped unsent", st)
	}
	wantUncharged(t, s, "late", l, "Takes given up at by")
}

// TestSubmitWaitsForRoomUntilBy: a call that finds the batch queue full
// (here a batcher without senders, its queue of one taken) waits for room
// only until its by: at by exactly it fails, unsent, with a
// *limiter.DeadlineError wrapping context.DeadlineExceeded, and the count
// of queued calls is as it was.
func TestSubmitWaitsForRoomUntilBy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &batcher{calls: make(chan *call, 1), stop: make(chan struct{}), stats: &counters{}}
		b.calls <- &call{}
		start := time.Now()
		c := b.submit(context.Background(), start.Add(10*time.Millisecond), scriptCall{})
		if took := time.Since(start); took != 10*time.Millisecond {
			t.Errorf("submit to a full queue returned after %v, want exactly 10ms (its by)", took)
		}
		select {
		case <-c.done:
		default:
			t.Fatal("submit returned a call without an answer")
		}
		var de *limiter.DeadlineError
		if err := c.cmd.Err(); !errors.As(err, &de) || !errors.Is(err, context.DeadlineExceeded) || de.InFlight != 0 || de.Queued != 10*time.Millisecond {
			t.Errorf("call = %v, want an unsent *limiter.DeadlineError wrapping DeadlineExceeded after 10ms queued", err)
		}
		if q := b.queued.Load(); q != 0 {
			t.Errorf("queued = %d after the call gave up, want 0", q)
		}
	})
}

// TestTakeByOfADirectCall: a Take sent from its caller's goroutine (Redis
// idle) to a Redis that does not answer (CLIENT PAUSE) returns at its by,
// a second before its caller's deadline, as sent (InFlight > 0).
func TestTakeByOfADirectCall(t *testing.T) {
	srv := redistest.Start(t)
	s := dialedStore(t, srv.Addr, Options{Prefix: "direct:"})
	if err := srv.Client().Do(context.Background(), "CLIENT", "PAUSE", "500", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	before := s.Stats()
	start := time.Now()
	_, err := s.TakeBy(ctx, start.Add(20*time.Millisecond), start, []limiter.Request{{Key: "paused", Limit: l, Hits: 1}})
	took := time.Since(start)
	var de *limiter.DeadlineError
	if !errors.As(err, &de) || de.InFlight == 0 {
		t.Fatalf("TakeBy 20ms ahead, Redis paused: %v, want a *limiter.DeadlineError of a sent call", err)
	}
	if took < 20*time.Millisecond || took > 400*time.Millisecond {
		t.Errorf("TakeBy 20ms ahead, Redis paused, returned after %v; want at 20ms", took)
	}
	if st := s.Stats(); st.Direct-before.Direct != 1 {
		t.Errorf("Stats = %+v, want the call sent directly", st)
	}

	// A by already past: not sent at all, though the caller's context
	// is not done.
	before = s.Stats()
	_, err = s.TakeBy(ctx, time.Now().Add(-time.Millisecond), time.Now(), []limiter.Request{{Key: "late", Limit: l, Hits: 1}})
	if !errors.As(err, &de) || de.InFlight != 0 || de.Pending || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("TakeBy with a past by = %v, want a *limiter.DeadlineError of a call never sent, wrapping DeadlineExceeded", err)
	}
	if st := s.Stats(); st.Calls != before.Calls || st.Direct != before.Direct {
		t.Errorf("a TakeBy with a past by was sent: %+v after %+v", st, before)
	}
}

// TestIODeadline: the context of a direct call has the earlier of its by
// and its caller's deadline, and is done only when the caller's context is.
func TestIODeadline(t *testing.T) {
	now := time.Now()
	far, cancelFar := context.WithDeadline(context.Background(), now.Add(time.Hour))
	defer cancelFar()
	near, cancelNear := context.WithDeadline(context.Background(), now.Add(time.Millisecond))
	defer cancelNear()
	for _, tc := range []struct {
		name   string
		parent context.Context
		by     time.Time
		want   time.Time
	}{
		{"no deadline", context.Background(), now.Add(time.Second), now.Add(time.Second)},
		{"by first", far, now.Add(time.Second), now.Add(time.Second)},
		{"caller's first", near, now.Add(time.Second), now.Add(time.Millisecond)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ioDeadline{Context: tc.parent, by: tc.by}
			if dl, ok := ctx.Deadline(); !ok || !dl.Equal(tc.want) {
				t.Errorf("Deadline() = %v, %v; want %v, true", dl, ok, tc.want)
			}
			if ctx.Done() != tc.parent.Done() {
				t.Error("Done() is not the caller's")
			}
		})
	}
}

// TestTheLearnerPassesTheBudgetOn: failover over the denial cache's learner
// over this store (as the daemon stacks them) gives a call without a
// deadline its DefaultDeadline as a budget, and the learner passes it to
// the store: a call queued for 60ms is answered per the failure mode as
// overloaded at 10ms, not decided when its batch goes out.
func TestTheLearnerPassesTheBudgetOn(t *testing.T) {
	srv := redistest.Start(t)
	s := queueingStore(t, srv, 60*time.Millisecond, nil)
	cache, err := denialcache.New(denialcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs, err := failover.New(cache.Learn(s), failover.Options{Mode: failover.Deny, Timeout: 5 * time.Millisecond, DefaultDeadline: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	start := time.Now()
	d, err := fs.Take(context.Background(), start, []limiter.Request{{Key: "budget", Limit: l, Hits: 1}})
	took := time.Since(start)
	if err != nil || d[0].Allowed || d[0].Fallback != limiter.FallbackOverloaded {
		t.Fatalf("Take queued past its 10ms budget = %+v, %v; want denied per the failure mode, overloaded", d, err)
	}
	if took < 10*time.Millisecond || took >= 60*time.Millisecond {
		t.Errorf("Take with a 10ms budget returned after %v, want at 10ms, before its batch went out (60ms)", took)
	}
}

// TestAbandonedTakesAreGivenBack: callers give up (30 ms deadlines) on
// coalesced Takes while Redis is paused for 150 ms. Those already sent
// (the two senders' batches) Redis runs after the callers left; it admits
// them, and each is given back: the buckets end as full as they began
// (their keys gone), and OnBackend hears a success for each. The others
// waited in the queue and are never sent. Every caller was told only that
// its deadline came (Pending for the sent ones), no Redis failure.
func TestAbandonedTakesAreGivenBack(t *testing.T) {
	srv := redistest.Start(t)
	var mu sync.Mutex
	var outcomes []error
	s := queueingStore(t, srv, 100*time.Microsecond, func(err error) {
		mu.Lock()
		outcomes = append(outcomes, err)
		mu.Unlock()
	})
	if err := srv.Client().Do(context.Background(), "CLIENT", "PAUSE", "150", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Count: 1, Period: time.Hour, Burst: 10}
	var wg sync.WaitGroup
	var sent atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			_, err := s.Take(ctx, time.Now(), []limiter.Request{{Key: fmt.Sprint("abandoned-", i), Limit: l, Hits: 3}})
			var de *limiter.DeadlineError
			switch {
			case !errors.As(err, &de) || errors.Is(err, limiter.ErrUnavailable):
				t.Errorf("Take %d = %v, want a *limiter.DeadlineError, no Redis failure", i, err)
			case de.InFlight > 0 && de.Pending:
				sent.Add(1)
			case de.InFlight > 0 || de.Pending:
				t.Errorf("Take %d = %+v: sent to Redis and Pending go together", i, de)
			}
		})
	}
	wg.Wait()
	n := sent.Load()
	if n == 0 {
		t.Fatal("no call was sent before its caller gave up: nothing to give back")
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().LateGiveBacks < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// The give-backs are refunds, whose keys are deleted once full.
	for s.Stats().Pending > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	st := s.Stats()
	if st.Late != n || st.LateGiveBacks != n || st.LateGiveBackFailures != 0 {
		t.Errorf("Stats = %+v, want %d late answers (the calls sent), all given back", st, n)
	}
	t.Logf("%d of 20 Takes sent before their callers gave up, all given back", n)
	keys, err := srv.Client().Keys(context.Background(), "overload:{*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("%d buckets still hold tokens taken for callers that had gone: %v", len(keys), keys)
	}
	mu.Lock()
	defer mu.Unlock()
	if int64(len(outcomes)) != n {
		t.Errorf("OnBackend heard %d outcomes, want %d", len(outcomes), n)
	}
	for _, err := range outcomes {
		if err != nil {
			t.Errorf("OnBackend(%v), want nil: Redis answered", err)
		}
	}
}
